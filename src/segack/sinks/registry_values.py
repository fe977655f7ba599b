"""A :class:`~segack.sinks.KafkaSink`'s values in Confluent's wire format, through a Schema
Registry: :class:`RegistryValues`.

Given to the sink as ``values=``, it lets ``apply`` give ``output.produce(topic, value=...)`` a dict
(Avro, JSON Schema) or a Protobuf message where it would give bytes: the record's value is then
what confluent-kafka's own serializer of that format writes (the magic byte, the schema's id, for
Protobuf the message indexes, then the payload), in the call's transaction like any other record.
A str or bytes value is sent as it is.

1. **When the run starts** (:meth:`~segack.sinks.RegistryValues.prepare`, on the driver, after
   the sink's own checks), each topic's schema (for Protobuf, its message type's) is registered
   under the subject ``<topic>-value`` (the topic naming strategy, pinned), or, with
   ``auto_register=False``, looked up there, so that a registry away (10 s per request), refusing
   the credentials, refusing the schema as incompatible, or lacking it, stops the run in one line
   before any event.
2. **In each executor process**, the client and the serializers are made once per settings and
   topic, shared by every task and micro-batch; each learns its schema's id from the registry once.
3. **Per record**, a value its schema does not take fails the call, naming the topic and why: the
   run retries it or sets its event aside as ``retries`` and ``on_error`` say; nothing of the call
   is sent. A registry that fails mid-run (one that was asked already is not asked again) fails
   the call the same way, as :class:`~segack.spark_adapter.SchemaRegistryError`: under
   ``--on-error dead-letter`` its events are set aside, to be retried once it answers
   (``--retry-dead-letters``).
"""

from __future__ import annotations

import json
import os
import ssl
import threading
from collections.abc import Mapping
from typing import Any

from segack.errors import SegackTypeError, SegackValueError
from segack.spark_adapter.errors import OptionError, SchemaRegistryError, SinkError
from segack.spark_adapter.worker.schema_registry import (
    PREFIX,
    RegistrySettings,
    SchemaRegistry,
    registry_settings,
    shown_url,
)

__all__ = ["FORMATS", "RegistryValues"]

#: The formats :class:`RegistryValues` writes, and what ``apply`` gives for each.
FORMATS = {"avro": "a dict", "json-schema": "a dict", "protobuf": "a Protobuf message"}
_KINDS = {"avro": "AVRO", "json-schema": "JSON", "protobuf": "PROTOBUF"}
#: Seconds a request to the registry may take (confluent-kafka's client waits forever unless told).
TIMEOUT = 10
# What each executor process made, by what it was made of: the client, and the serializers by topic
# (and message type). A sink is unpickled afresh for every task: the registry is asked once a process.
_MADE: dict[Any, tuple[Any, dict[Any, Any]]] = {}
_LOCK = threading.Lock()


class RegistryValues:
    """Values written in Confluent's wire format through a Schema Registry, for a
    :class:`~segack.sinks.KafkaSink` (``values=``); see :mod:`~segack.sinks.registry_values`.

    Parameters
    ----------
    value_format : str
        The values' format: ``"avro"``, ``"protobuf"`` or ``"json-schema"``.
    registry : mapping
        The registry's settings as a stream's options name them (``schema.registry.url``,
        ``schema.registry.basic.auth.user.info``, ``schema.registry.ssl.ca.location``): give a
        stream's options, and the sink reaches the registry the stream reads through. Other
        options are not read.
    schemas : mapping, optional
        Each topic's schema: for Avro a record's, for JSON Schema an object's (JSON text); for
        Protobuf the message type (the generated class) its values are. A topic without one takes
        str or bytes values only.
    auto_register : bool, default ``True``
        Register a schema the subject lacks (as confluent-kafka's serializers do by default);
        ``False`` for a registry where producers may not register: each schema must be there.

    Raises
    ------
    SegackValueError
        A format not in :data:`~segack.sinks.registry_values.FORMATS`; registry settings a stream
        would refuse, or none; a bearer token (confluent-kafka's client takes one only with
        Confluent Cloud's cluster ids: give ``USER:PASSWORD``); an Avro schema that is not a
        record's, a JSON Schema that is not an object's or not a valid schema.
    SegackTypeError
        ``registry`` or ``schemas`` not a mapping; an Avro or JSON schema not text, a Protobuf one
        not a message class.
    """

    def __init__(self, value_format: str, registry: Mapping[str, str],
                 schemas: Mapping[str, str] | None = None, *, auto_register: bool = True) -> None:
        if value_format not in FORMATS:
            raise SegackValueError(f"RegistryValues: value_format must be one of {', '.join(FORMATS)}, not "
                                   f"{value_format!r}")
        if not isinstance(registry, Mapping) or not (schemas is None or isinstance(schemas, Mapping)):
            raise SegackTypeError("RegistryValues: registry and schemas must be mappings")
        try:
            settings, _ = registry_settings({name: value for name, value in registry.items()
                                             if str(name).startswith(PREFIX)})
        except OptionError as error:
            raise SegackValueError(f"RegistryValues: {error}") from None
        if settings is None:
            raise SegackValueError(f"RegistryValues: registry must give {PREFIX}url")
        if settings.bearer_token is not None:
            raise SegackValueError(f"RegistryValues: {PREFIX}bearer.auth.token is not taken for writing: "
                                   f"confluent-kafka's client sends a token only with Confluent Cloud's "
                                   f"cluster ids; give {PREFIX}basic.auth.user.info=USER:PASSWORD")
        self.value_format, self.settings, self.auto_register = value_format, settings, bool(auto_register)
        self.schemas = {str(topic): _checked_schema(value_format, topic, text)
                        for topic, text in (schemas or {}).items()}


    def check_topics(self, topics: frozenset[str]) -> None:
        """Refuse ``schemas`` of a topic the sink does not write (a ``SegackValueError``)."""
        stray = sorted(set(self.schemas) - topics)
        if stray:
            raise SegackValueError(f"KafkaSink: values has a schema for {', '.join(stray)}, not one of the "
                                   f"sink's topics ({', '.join(sorted(topics))})")

    def prepare(self) -> None:
        """Step 1: the registry asked whether it answers and holds the format, then each topic's
        schema registered (or, without ``auto_register``, found) under ``<topic>-value``, on the
        driver; a :class:`~segack.spark_adapter.SinkError` in one line when the registry is away,
        refuses, or lacks or rejects a schema."""
        where = shown_url(self.settings.url)
        try:
            formats = SchemaRegistry.of(self.settings).formats()
        except SchemaRegistryError as error:
            raise SinkError(f"KafkaSink: {error}") from None
        if _KINDS[self.value_format] not in formats:
            raise SinkError(f"KafkaSink: the Schema Registry at {where} holds no {self.value_format} schemas")
        for topic, schema in self.schemas.items():
            try:
                self._register(topic, schema)
            except (SchemaRegistryError, SegackValueError) as error:
                raise SinkError(f"KafkaSink: {error}") from None

    def _register(self, topic: str, schema: Any) -> None:
        from confluent_kafka.schema_registry import Schema

        subject = f"{topic}-value"
        client = self._made()[0]
        try:
            if self.value_format == "protobuf":  # the serializer registers the file and its imports
                self._serializer(topic)(schema(), _context(topic))
            elif self.auto_register:
                client.register_schema(subject, Schema(schema, _KINDS[self.value_format]))
            else:
                client.lookup_schema(subject, Schema(schema, _KINDS[self.value_format]))
        except Exception as error:  # confluent-kafka's SchemaRegistryError, or its HTTP client's
            raise SchemaRegistryError(f"the Schema Registry at {shown_url(self.settings.url)} {_why(error)}, "
                                      f"for subject {subject}") from None

    def serialize(self, topic: str, value: Any) -> bytes:
        """Steps 2 and 3: ``value`` for ``topic`` in the wire format.

        Raises
        ------
        SegackValueError
            A topic without a schema (Avro, JSON Schema), a value its schema does not take.
        SegackTypeError
            A value that is not :data:`~segack.sinks.registry_values.FORMATS`' kind for the format.
        ~segack.spark_adapter.SchemaRegistryError
            The registry does not answer, or refuses.
        """
        if topic not in self.schemas:
            raise SegackValueError(f"KafkaOutput: topic {topic} has no schema in the sink's values: give "
                                   f"RegistryValues(schemas={{{topic!r}: ...}}), or a str or bytes value")
        expected = self.schemas[topic] if self.value_format == "protobuf" else Mapping
        if not isinstance(value, expected):
            kind = "" if expected is Mapping else f" of {expected.__name__}"
            raise SegackTypeError(f"KafkaOutput: a value for {topic} must be {FORMATS[self.value_format]}"
                                  f"{kind}, str or bytes, not {type(value).__name__}")
        serializer = self._serializer(topic)
        try:
            written: bytes = serializer(value, _context(topic))
        except Exception as error:  # the schema's refusal of the value, or the registry's
            if _is_registry_failure(error):
                raise SchemaRegistryError(f"the Schema Registry at {shown_url(self.settings.url)} "
                                          f"{_why(error)}") from None
            raise SegackValueError(f"KafkaOutput: a value for {topic} does not fit its {self.value_format} "
                                   f"schema: {type(error).__name__}: {_bounded(str(error))}") from None
        return written

    def _made(self) -> tuple[Any, dict[Any, Any]]:
        """This process's client of the registry and its serializers (step 2); a
        :class:`~segack.spark_adapter.SchemaRegistryError` for a CA this host lacks."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        key = (self.settings, self.value_format, self.auto_register)
        with _LOCK:
            made = _MADE.get(key)
            if made is None:
                try:
                    made = _MADE[key] = (SchemaRegistryClient(_client_config(self.settings)), {})
                except (OSError, ssl.SSLError) as error:
                    raise SchemaRegistryError(
                        f"{PREFIX}ssl.ca.location {self.settings.ca_location} cannot be read on this host "
                        f"({getattr(error, 'strerror', None) or error}): every executor reads it at the "
                        f"same path (ship it with --files, or bake it into the image)") from None
        return made

    def _serializer(self, topic: str) -> Any:
        client, serializers = self._made()
        key = (topic, self.schemas[topic])
        with _LOCK:
            found = serializers.get(key)
            if found is None:
                found = serializers[key] = self._make_serializer(client, self.schemas[topic])
        return found

    def _make_serializer(self, client: Any, schema: Any) -> Any:
        from confluent_kafka.schema_registry import topic_subject_name_strategy

        # <topic>-value, as prepare() registered: newer clients first ask the registry for an
        # "associated" subject, which would write elsewhere than was checked.
        config = {"auto.register.schemas": self.auto_register,
                  "subject.name.strategy": topic_subject_name_strategy}
        if self.value_format == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            return AvroSerializer(client, schema, conf=config)
        if self.value_format == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            return JSONSerializer(schema, client, conf=config)
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        return ProtobufSerializer(schema, client, {**config, "use.deprecated.format": False})


def _context(topic: str) -> Any:
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.VALUE)


def _client_config(settings: RegistrySettings) -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` settings of ``settings``."""
    config: dict[str, Any] = {"url": settings.url, "timeout": TIMEOUT}
    if settings.user_info is not None:
        config["basic.auth.user.info"] = settings.user_info
    # The system's CAs where none is given, as the stream's reader trusts (not certifi's bundle).
    ca = settings.ca_location or ssl.get_default_verify_paths().cafile
    if ca is not None and os.path.isfile(ca):
        config["ssl.ca.location"] = ca
    return config


def _checked_schema(value_format: str, topic: Any, schema: Any) -> Any:
    """``schema``, once it is ``value_format``'s (:class:`RegistryValues` ``schemas``); a
    :class:`SegackValueError` or :class:`SegackTypeError` saying why not."""
    if value_format == "protobuf":
        from google.protobuf.message import Message

        if not (isinstance(schema, type) and issubclass(schema, Message)):
            raise SegackTypeError(f"RegistryValues: the schema of {topic} must be its Protobuf message "
                                  f"class, not {type(schema).__name__}")
        return schema
    if not isinstance(schema, str):
        raise SegackTypeError(f"RegistryValues: the schema of {topic} must be its JSON text, not "
                              f"{type(schema).__name__}")
    try:
        parsed = json.loads(schema)
        if value_format == "avro":
            import fastavro

            named = fastavro.parse_schema(parsed)
        else:
            from jsonschema.validators import validator_for

            validator_for(parsed).check_schema(parsed)
            named = parsed
    except Exception as error:  # JSON's ValueError, fastavro's and jsonschema's own
        raise SegackValueError(f"RegistryValues: the schema of {topic} is not {value_format}'s: "
                               f"{type(error).__name__}: {_bounded(str(error))}") from None
    wanted, what = ("record", "a record's schema") if value_format == "avro" else (
        "object", 'a schema of "type": "object"')
    if not isinstance(named, dict) or named.get("type") != wanted:
        raise SegackValueError(f"RegistryValues: the schema of {topic} is not {value_format}'s for a sink, "
                               f"which writes dicts: give {what}")
    return schema


def _bounded(text: str) -> str:
    """``text`` on one line, at most 300 characters: a registry's or a library's message may be a
    whole page."""
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:297] + "..."


def _is_registry_failure(error: BaseException) -> bool:
    """Whether ``error`` is the registry's (away, refusing), not the value's."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as RegistryAnswer

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (RegistryAnswer, ConnectionError, OSError, json.JSONDecodeError)) or type(
                cause).__module__.startswith(("httpx", "httpcore")):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _why(error: BaseException) -> str:
    """What the registry's ``error`` says, with no address or credentials in it."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as RegistryAnswer

    if isinstance(error, RegistryAnswer):
        said = "" if str(error.error_message).startswith("Unknown Schema Registry Error") else (
            f": {_bounded(str(error.error_message))}")  # a page that is not the registry's: not shown
        return f"answered {error.http_status_code} (error code {error.error_code}){said}"
    reason = error.__cause__ or error.__context__ or error
    return f"did not answer ({type(error).__name__}: {_bounded(str(reason))})"
