"""A :class:`~segack.sinks.KafkaSink`'s values in Confluent's wire format, through a Schema
Registry: :class:`RegistryValues`.

Given to the sink as ``values=``, it lets ``apply`` give ``output.produce(topic, value=...)`` a dict
(Avro, JSON Schema) or a Protobuf message where it would give bytes: the record's value is then
what confluent-kafka's own serializer of that format writes (the magic byte, the schema's id, for
Protobuf the message indexes, then the payload), in the call's transaction like any other record.
A str or bytes value is sent as it is.

1. **When the run starts** (:meth:`~segack.sinks.RegistryValues.prepare`, on the driver), each
   topic's schema is registered under the subject ``<topic>-value`` (Confluent's default naming), or, with
   ``auto_register=False``, looked up there, so that a registry away, refusing the credentials,
   refusing the schema as incompatible, or lacking it, stops the run in one line before any event.
2. **In each task**, the serializers are made once per process and topic (once per message type
   for Protobuf); each learns its schema's id from the registry once.
3. **Per record**, a value its schema does not take fails the call, naming the topic and why: the
   run retries it or sets its event aside as ``retries`` and ``on_error`` say; nothing of the call
   is sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from segack.errors import SegackTypeError, SegackValueError
from segack.spark_adapter.errors import OptionError, SchemaRegistryError, SinkError
from segack.spark_adapter.worker.schema_registry import PREFIX, RegistrySettings, registry_settings, shown_url

__all__ = ["FORMATS", "RegistryValues"]

#: The formats :class:`RegistryValues` writes, and what ``apply`` gives for each.
FORMATS = {"avro": "a dict", "json-schema": "a dict", "protobuf": "a Protobuf message"}


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
        Avro and JSON Schema: each topic's schema (its JSON text). A topic without one takes str or
        bytes values only. Protobuf: not given, each message's own descriptor is its schema.
    auto_register : bool, default ``True``
        Register a schema the subject lacks (as confluent-kafka's serializers do by default);
        ``False`` for a registry where producers may not register: each schema must be there.

    Raises
    ------
    SegackValueError
        A format not in :data:`~segack.sinks.registry_values.FORMATS`; registry settings a stream
        would refuse, or none; a bearer token (confluent-kafka's client takes one only with
        Confluent Cloud's cluster ids: give ``USER:PASSWORD``); ``schemas`` for Protobuf, or a
        schema that is not its format's JSON.
    SegackTypeError
        ``registry`` or ``schemas`` not a mapping, or a schema not text.
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
        self._opened()

    def _opened(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._serializers: dict[Any, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Clients stay where they were made: each task's process makes its own.
        return {name: value for name, value in self.__dict__.items()
                if name not in ("_lock", "_client", "_serializers")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._opened()

    def check_topics(self, topics: frozenset[str]) -> None:
        """Refuse ``schemas`` of a topic the sink does not write (a ``SegackValueError``)."""
        stray = sorted(set(self.schemas) - topics)
        if stray:
            raise SegackValueError(f"KafkaSink: values has a schema for {', '.join(stray)}, not one of the "
                                   f"sink's topics ({', '.join(sorted(topics))})")

    def prepare(self) -> None:
        """Step 1: each topic's schema registered (or, without ``auto_register``, found) under
        ``<topic>-value``, on the driver; a :class:`~segack.spark_adapter.SinkError` in one line
        when the registry is away, refuses, or lacks or rejects a schema."""
        from confluent_kafka.schema_registry import Schema

        kind = {"avro": "AVRO", "json-schema": "JSON", "protobuf": "PROTOBUF"}[self.value_format]
        client = self._registry_client()
        where = shown_url(self.settings.url)
        try:
            client.get_subjects()  # answers, and takes the credentials, whatever the format
            for topic, text in self.schemas.items():
                schema = Schema(text, kind)
                if self.auto_register:
                    client.register_schema(f"{topic}-value", schema)
                else:
                    client.lookup_schema(f"{topic}-value", schema)
        except Exception as error:  # confluent-kafka's SchemaRegistryError, or its HTTP client's
            raise SinkError(f"KafkaSink: the Schema Registry at {where} {_why(error)}") from None

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
        from confluent_kafka.serialization import MessageField, SerializationContext

        if self.value_format == "protobuf":
            from google.protobuf.message import Message

            if not isinstance(value, Message):
                raise SegackTypeError(f"KafkaOutput: a value for {topic} must be a Protobuf message, str or "
                                      f"bytes, not {type(value).__name__}")
            serializer = self._serializer((topic, type(value)))
        else:
            if not isinstance(value, Mapping):
                raise SegackTypeError(f"KafkaOutput: a value for {topic} must be a dict, str or bytes, not "
                                      f"{type(value).__name__}")
            if topic not in self.schemas:
                raise SegackValueError(f"KafkaOutput: topic {topic} has no schema in the sink's values: give "
                                       f"RegistryValues(schemas={{{topic!r}: ...}}), or a str or bytes value")
            serializer = self._serializer(topic)
        try:
            written: bytes = serializer(value, SerializationContext(topic, MessageField.VALUE))
        except Exception as error:  # the schema's refusal of the value, or the registry's
            if _is_registry_failure(error):
                raise SchemaRegistryError(f"the Schema Registry at {shown_url(self.settings.url)} "
                                          f"{_why(error)}") from None
            raise SegackValueError(f"KafkaOutput: a value for {topic} does not fit its "
                                   f"{self.value_format} schema: {type(error).__name__}: {error}") from None
        return written

    def _serializer(self, key: Any) -> Any:
        with self._lock:
            found = self._serializers.get(key)
            if found is None:
                found = self._serializers[key] = self._make_serializer(key)
        return found

    def _make_serializer(self, key: Any) -> Any:
        config = {"auto.register.schemas": self.auto_register}
        if self.value_format == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            return AvroSerializer(self._registry_client(), self.schemas[key], conf=config)
        if self.value_format == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            return JSONSerializer(self.schemas[key], self._registry_client(), conf=config)
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        return ProtobufSerializer(key[1], self._registry_client(), {**config, "use.deprecated.format": False})

    def _registry_client(self) -> Any:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        if self._client is None:
            self._client = SchemaRegistryClient(_client_config(self.settings))
        return self._client


def _client_config(settings: RegistrySettings) -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` settings of ``settings``."""
    config: dict[str, Any] = {"url": settings.url}
    if settings.user_info is not None:
        config["basic.auth.user.info"] = settings.user_info
    if settings.ca_location is not None:
        config["ssl.ca.location"] = settings.ca_location
    return config


def _checked_schema(value_format: str, topic: Any, text: Any) -> str:
    """``text``, once it is ``value_format``'s schema; a :class:`SegackValueError` saying why not."""
    if value_format == "protobuf":
        raise SegackValueError("RegistryValues: Protobuf takes no schemas: each message's own descriptor is "
                               "its schema")
    if not isinstance(text, str):
        raise SegackTypeError(f"RegistryValues: the schema of {topic} must be its JSON text, not "
                              f"{type(text).__name__}")
    try:
        parsed = json.loads(text)
        if value_format == "avro":
            import fastavro

            fastavro.parse_schema(parsed)
    except Exception as error:  # JSON's ValueError, fastavro's SchemaParseException and UnknownType
        raise SegackValueError(f"RegistryValues: the schema of {topic} is not {value_format}'s: "
                               f"{type(error).__name__}: {error}") from None
    return text


def _is_registry_failure(error: BaseException) -> bool:
    """Whether ``error`` is the registry's (away, refusing), not the value's."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as RegistryAnswer

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (RegistryAnswer, ConnectionError, OSError)) or type(cause).__module__.startswith(
                ("httpx", "httpcore")):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _why(error: BaseException) -> str:
    """What the registry's ``error`` says, with no address or credentials in it."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as RegistryAnswer

    if isinstance(error, RegistryAnswer):
        return f"answered {error.http_status_code} (error code {error.error_code}): {error.error_message}"
    return f"did not answer ({type(error).__name__})"
