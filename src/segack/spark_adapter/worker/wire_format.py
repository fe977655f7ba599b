"""Values in Confluent's wire format, decoded by their own writer's schema.

A value in the wire format is a magic byte ``0``, its writer schema's id in the registry (4 bytes,
big-endian), then the payload:

- **Avro**: the record in Avro's binary encoding, read with the writer's schema and resolved to
  the reader's, so a field an older writer lacks takes its default and one a newer writer added is
  dropped; a topic whose records hold several writer versions decodes in one batch, and a version
  registered while the stream runs is read without a restart. The reader is the latest version of
  the topic's subject ``<topic>-value``: asked by the driver when the run starts for the topics it
  knows (:class:`WireFormat` ``readers``), else (a topic of ``subscribePattern``) once per process
  the first time one of its records is read; a topic whose subject has no version is read by each
  writer's own schema. Bytes after the record are an error, as they are to Confluent's reader.
- **Protobuf**: the message indexes (a zigzag varint count, then that many zigzag varints, the
  path of the message type in the ``.proto`` file; a count of ``0`` means the first type), then the
  message. Read with the writer's descriptor; a field of a message type is a dict (a
  ``google.protobuf.Timestamp`` a moment in UTC), a repeated one a list, an enum its name.
- **JSON Schema**: the value as JSON text.

A reader schema can be given instead of each subject's latest (Spark's ``from_avro`` option
``avroSchema``, JSON text): every Avro value is then resolved to it. Given with no registry, it is
the schema every value was written by, in plain binary Avro with no header (what Spark's
``to_avro`` writes): :class:`WireFormat` with ``registry`` None reads those.

Each writer's schema is asked of the registry once per process (executors share it between
tasks) and parsed once. :meth:`WireFormat.decode` gives the value as a dict, the same one a JSON
object gives, or raises :class:`UndecodableValueError` saying why: not in the wire format (the first byte is
not ``0``, or there are fewer than five), an id the registry does not hold, a schema of another
format, a schema segack cannot read (an Avro schema naming a type of another subject, a Protobuf one
imported from another), a payload the schema does not read. Bytes are given as base64 text.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from segack.errors import SegackValueError
from segack.spark_adapter.worker.schema_registry import (
    RegisteredSchema,
    RegistrySettings,
    SchemaRegistry,
    UnknownSchemaError,
    shown_url,
)

__all__ = ["AVRO_SCHEMA", "REGISTRY_FORMATS", "OtherFormatError", "UndecodableValueError", "WireFormat",
           "avro_schema", "latest_reader", "message_indexes"]

#: The reader option of a given Avro schema, JSON text, as Spark's ``from_avro`` names it.
AVRO_SCHEMA = "avroSchema"

#: The value formats whose values are in Confluent's wire format, and the registry's name for each.
REGISTRY_FORMATS = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}
_NAMES = {"AVRO": "Avro", "PROTOBUF": "Protobuf", "JSON": "JSON Schema"}
_HEADER = struct.Struct(">bi")  # the id is a signed 32-bit integer, as Confluent's Java clients write it

# Parsed writers' schemas by (registry, id, and the reader or the Protobuf message's path): what a
# process parses once and every task of it reads; bounded, as garbage ids and indexes make keys.
# The reader schemas asked for topics the run did not know, by (registry, topic).
_PARSED: dict[tuple[Any, ...], Any] = {}
_PARSED_KEPT = 4096
_READERS: dict[tuple[RegistrySettings, str], str | None] = {}
_LOCK = threading.Lock()


class UndecodableValueError(SegackValueError):
    """A value the format does not decode; its message says why."""


class OtherFormatError(UndecodableValueError):
    """A value of a topic whose subject holds schemas of another format, ``schema_type``."""

    def __init__(self, message: str, schema_type: str) -> None:
        super().__init__(message)
        self.schema_type = schema_type


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The zigzag varint at ``at`` and the index after it."""
    shift = result = 0
    while True:
        if at >= len(data) or shift > 63:
            raise UndecodableValueError("ends inside its Protobuf message indexes")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def message_indexes(data: bytes, at: int = 0) -> tuple[tuple[int, ...], int]:
    """The message indexes at ``at`` of a Protobuf value's payload and where the message starts."""
    count, at = _varint(data, at)
    if count == 0:
        return (0,), at
    if count < 0 or count > 100:
        raise UndecodableValueError(f"has a count of {count} Protobuf message indexes")
    indexes = []
    for _ in range(count):
        index, at = _varint(data, at)
        if index < 0:
            raise UndecodableValueError(f"has a negative Protobuf message index ({index})")
        indexes.append(index)
    return tuple(indexes), at


def _message_dict(message: Any) -> dict[str, Any]:
    """A Protobuf message as a dict of its fields, as :mod:`~segack.spark_adapter.worker.wire_format` says."""
    from google.protobuf.descriptor import FieldDescriptor

    result: dict[str, Any] = {}
    for descriptor in message.DESCRIPTOR.fields:
        value = getattr(message, descriptor.name)
        is_message = descriptor.type == FieldDescriptor.TYPE_MESSAGE
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            value_field = descriptor.message_type.fields_by_name["value"]
            result[descriptor.name] = {key: _field_value(value_field, item) for key, item in value.items()}
        elif _is_repeated(descriptor):
            result[descriptor.name] = [_field_value(descriptor, item) for item in value]
        elif (is_message or descriptor.has_presence) and not message.HasField(descriptor.name):
            result[descriptor.name] = None
        else:
            result[descriptor.name] = _field_value(descriptor, value)
    return result


def _is_repeated(descriptor: Any) -> bool:
    repeated = getattr(descriptor, "is_repeated", None)  # protobuf 6 names it; 5 has the label
    return bool(repeated) if repeated is not None else descriptor.label == descriptor.LABEL_REPEATED


def _field_value(descriptor: Any, value: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor

    if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
        if descriptor.message_type.full_name == "google.protobuf.Timestamp":
            return value.ToDatetime(tzinfo=dt.UTC)
        return _message_dict(value)
    if descriptor.type == FieldDescriptor.TYPE_ENUM:
        named = descriptor.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    if descriptor.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def _avro_value(value: Any) -> Any:
    """An Avro value with its bytes as base64 text, as the JSON-like dict of a record carries it."""
    if isinstance(value, dict):
        return {name: _avro_value(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_avro_value(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    return value


def _protobuf_file(schema: RegisteredSchema) -> tuple[Any, Any]:
    """The pool holding ``schema``'s serialized ``FileDescriptorProto``, and the file; or an
    :class:`UndecodableValueError` saying why it does not build."""
    # The well-known types a schema may import, in the default pool to be copied from it.
    from google.protobuf import (  # noqa: F401
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )
    from google.protobuf.message import DecodeError

    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema.text, validate=True))
    except (ValueError, DecodeError):  # binascii.Error is a ValueError
        raise UndecodableValueError(
            f"names schema id {schema.schema_id}, which the registry gives as .proto text, not serialized "
            f"(?format=serialized): segack reads Protobuf through a registry that serves it, as Confluent's "
            f"since 5.5 and Karapace do") from None
    pool = descriptor_pool.DescriptorPool()
    known = descriptor_pool.Default()
    for dependency in proto.dependency:
        try:
            pool.AddSerializedFile(known.FindFileByName(dependency).serialized_pb)
        except KeyError:
            raise UndecodableValueError(
                f"names schema id {schema.schema_id}, which imports {dependency!r} from the registry "
                f"(references {', '.join(schema.references) or 'none'}), which segack does not read yet: "
                f"only Google's well-known types") from None
    try:
        pool.Add(proto)
    except (TypeError, ValueError) as error:
        raise UndecodableValueError(f"names schema id {schema.schema_id}, a Protobuf file that does not "
                                    f"build: {error}") from None
    return pool, proto


def _message_class(schema: RegisteredSchema, file: tuple[Any, Any], indexes: tuple[int, ...]) -> Any:
    """The message class at ``indexes`` of ``file`` (:func:`_protobuf_file`), or an
    :class:`UndecodableValueError` saying why there is none."""
    from google.protobuf import message_factory

    pool, proto = file
    types = proto.message_type
    names = []
    for index in indexes:
        if index >= len(types):
            raise UndecodableValueError(
                f"has Protobuf message indexes {list(indexes)} that name no message of schema id "
                f"{schema.schema_id}")
        names.append(types[index].name)
        types = types[index].nested_type
    full_name = ".".join(filter(None, (proto.package, *names)))
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))
    except (KeyError, TypeError) as error:
        raise UndecodableValueError(f"names schema id {schema.schema_id}, whose message {full_name} does not "
                                    f"build: {error}") from None


def _avro_schemas(writer: RegisteredSchema, reader_text: str | None) -> tuple[Any, Any, bool]:
    """The parsed writer's schema, the reader's (None when it is the writer's), and whether either
    holds bytes to give as text; an :class:`UndecodableValueError` for a schema fastavro cannot read."""
    import fastavro

    try:
        parsed_writer = fastavro.parse_schema(json.loads(writer.text))
    except Exception as error:  # fastavro's own: UnknownType, SchemaParseException, and JSON's ValueError
        reason = (f"names a type defined by another subject (references "
                  f"{', '.join(writer.references)}), which segack does not read yet"
                  if writer.references else f"{type(error).__name__}: {error}")
        raise UndecodableValueError(
            f"names schema id {writer.schema_id}, an Avro schema segack cannot read: {reason}") from None
    parsed_reader = None
    if reader_text is not None:
        try:
            parsed_reader = fastavro.parse_schema(json.loads(reader_text))
        except Exception as error:  # as above: the subject's latest is unreadable
            raise UndecodableValueError(f"is resolved to its subject's latest Avro schema, which segack "
                                        f"cannot read: {type(error).__name__}: {error}") from None
    # A record without bytes has none to turn into text: no walk through it.
    has_bytes = any(kind in text for text in (writer.text, reader_text or "")
                    for kind in ('"bytes"', '"fixed"'))
    return parsed_writer, None if parsed_reader == parsed_writer else parsed_reader, has_bytes


@dataclass(frozen=True)
class WireFormat:
    """Decodes values of ``value_format`` (a key of :data:`REGISTRY_FORMATS`) written through the
    registry ``registry``. ``readers`` holds, per topic, the Avro schema (JSON text) its values are
    resolved to, or None for a topic read by each writer's own schema; a topic it does not name has
    its subject's latest version asked once per process. ``reader``, when given, is the Avro schema
    every value is resolved to, whatever the topic; with ``registry`` None, it is the schema of
    every value, in plain binary Avro."""

    value_format: str
    registry: RegistrySettings | None
    readers: Mapping[str, str | None] = field(default_factory=dict)
    reader: str | None = None

    def decode(self, topic: str, value: bytes) -> dict[str, Any]:
        """The value of a record of ``topic`` as a dict, or :class:`UndecodableValueError`; a registry that
        does not answer is a :class:`~segack.spark_adapter.SchemaRegistryError`."""
        if self.registry is None:
            return self._plain(value)
        if len(value) < _HEADER.size or value[0] != 0:
            first = f"0x{value[0]:02x}" if value else "nothing"
            raise UndecodableValueError(
                f"is not in Confluent's wire format (it starts with {first}, not the magic byte 0x00 and "
                f"a schema id; a producer that puts the id in the record's headers is not read yet)")
        _, schema_id = _HEADER.unpack_from(value)
        if schema_id < 0:
            raise UndecodableValueError(f"names schema id {schema_id}, which no registry holds")
        payload = memoryview(value)[_HEADER.size:]
        if self.value_format == "avro":
            return self._avro(topic, schema_id, payload)
        if self.value_format == "protobuf":
            return self._protobuf(schema_id, bytes(payload))
        return self._json(schema_id, payload)

    def _writer(self, schema_id: int) -> RegisteredSchema:
        assert self.registry is not None  # a value in the wire format names its writer in one
        try:
            schema = SchemaRegistry.of(self.registry).schema(schema_id)
        except UnknownSchemaError:
            raise UndecodableValueError(
                f"names schema id {schema_id}, which the registry at {shown_url(self.registry.url)} "
                f"does not hold") from None
        expected = REGISTRY_FORMATS[self.value_format]
        if schema.schema_type != expected:
            found = _NAMES.get(schema.schema_type, schema.schema_type)
            raise UndecodableValueError(
                f"names schema id {schema_id}, whose schema is {found}, not {_NAMES[expected]}")
        return schema

    def _parsed(self, key: tuple[Any, ...], schema_id: int, make: Callable[[Any], Any]) -> Any:
        """What ``make`` gives of schema ``schema_id``'s writer (:meth:`_writer`), once per process
        for ``key`` (after the registry's settings). An :class:`UndecodableValueError` of ``make`` is
        kept and raised again, so that an unreadable schema is not read again per record; the
        writer's own (an unknown id, another format) is the registry client's to keep."""
        key = (self.registry, *key)
        with _LOCK:
            parsed = _PARSED.get(key)
        if parsed is None:
            writer = self._writer(schema_id)
            try:
                parsed = make(writer)
            except UndecodableValueError as error:
                parsed = error
            with _LOCK:
                if len(_PARSED) >= _PARSED_KEPT:  # ids and indexes garbage names: bounded, as a cache
                    _PARSED.clear()
                _PARSED[key] = parsed
        if isinstance(parsed, UndecodableValueError):
            raise UndecodableValueError(str(parsed))
        return parsed

    def _reader(self, topic: str) -> str | None:
        """The Avro schema ``topic``'s values are resolved to (:attr:`reader`, :attr:`readers`, else
        asked)."""
        if self.reader is not None:
            return self.reader
        if topic in self.readers:
            return self.readers[topic]
        assert self.registry is not None
        key = (self.registry, topic)
        with _LOCK:
            if key in _READERS:
                return _READERS[key]
        try:
            reader = latest_reader(self.registry, topic)
        except OtherFormatError:
            reader = None  # each value then names its own writer, whose format is what it says
        with _LOCK:
            _READERS[key] = reader
        return reader

    def _avro(self, topic: str, schema_id: int, payload: memoryview) -> dict[str, Any]:
        reader_text = self._reader(topic)
        writer, reader, has_bytes = self._parsed((schema_id, reader_text), schema_id,
                                                 lambda schema: _avro_schemas(schema, reader_text))
        return _avro_record(payload, writer, reader, has_bytes, "Avro", f"schema id {schema_id}")

    def _plain(self, value: bytes) -> dict[str, Any]:
        """A value in plain binary Avro, written by :attr:`reader`'s schema (no header, no registry)."""
        assert self.reader is not None
        key = ("plain", self.reader)
        with _LOCK:
            parsed = _PARSED.get(key)
        if parsed is None:
            has_bytes = any(kind in self.reader for kind in ('"bytes"', '"fixed"'))
            parsed = (avro_schema(self.reader), has_bytes)
            with _LOCK:
                _PARSED[key] = parsed
        schema, has_bytes = parsed
        return _avro_record(memoryview(value), schema, None, has_bytes, "plain Avro",
                            f"the schema given ({AVRO_SCHEMA})", ": a value not written by it, or not in "
                            "plain Avro (Confluent's wire format needs --schema-registry)")

    def _protobuf(self, schema_id: int, payload: bytes) -> dict[str, Any]:
        from google.protobuf.message import DecodeError

        try:
            indexes, start = message_indexes(payload)
        except UndecodableValueError:
            self._writer(schema_id)  # a schema of another format says so first
            raise
        file = self._parsed((schema_id,), schema_id, _protobuf_file)
        message_class = self._parsed((schema_id, indexes), schema_id,
                                     lambda schema: _message_class(schema, file, indexes))
        try:
            return _message_dict(message_class.FromString(payload[start:]))
        except (DecodeError, ValueError, OverflowError) as error:  # a Timestamp past year 9999, say
            raise UndecodableValueError(
                f"does not decode as Protobuf message {message_class.DESCRIPTOR.full_name} of "
                f"schema id {schema_id}: {error}") from None

    def _json(self, schema_id: int, payload: memoryview) -> dict[str, Any]:
        self._parsed((schema_id, "json"), schema_id, lambda schema: True)
        try:
            value = json.loads(bytes(payload))
        except (ValueError, RecursionError) as error:
            raise UndecodableValueError(
                f"is not JSON after its header (schema id {schema_id}): {error}") from None
        if not isinstance(value, dict):
            raise UndecodableValueError(
                f"is JSON {type(value).__name__}, not an object (schema id {schema_id})")
        return value


def _avro_record(payload: memoryview, writer: Any, reader: Any, has_bytes: bool, kind: str, by: str,
                 left_over: str = "") -> dict[str, Any]:
    """The Avro record ``payload`` holds, read by ``writer``'s schema and resolved to ``reader``'s
    (None: the writer's), its bytes as text if ``has_bytes``; an :class:`UndecodableValueError`
    saying why there is none, naming ``kind`` (the encoding), ``by`` (the schema) and, for bytes left
    after the record, ``left_over``."""
    import fastavro

    stream = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(stream, writer, reader)
    except Exception as error:  # fastavro raises what the bytes make it: EOFError, ValueError, ...
        raise UndecodableValueError(f"does not decode as {kind} by {by}: {type(error).__name__}: "
                                    f"{error}") from None
    if stream.tell() != len(payload):
        raise UndecodableValueError(f"has {len(payload) - stream.tell()} bytes after its Avro record "
                                    f"({by}){left_over}")
    if not isinstance(record, dict):
        raise UndecodableValueError(f"decodes by {by} as {type(record).__name__}, not a record")
    return _avro_value(record) if has_bytes else record


def avro_schema(text: str) -> Any:
    """The Avro schema of JSON ``text`` (:data:`AVRO_SCHEMA`), parsed; a
    :class:`~segack.errors.SegackValueError` for text that is not one, or not of a record."""
    import fastavro

    try:
        parsed = fastavro.parse_schema(json.loads(text))
    except Exception as error:  # fastavro's own: UnknownType, SchemaParseException, and JSON's ValueError
        raise SegackValueError(f"{AVRO_SCHEMA} is not an Avro schema fastavro reads: "
                               f"{type(error).__name__}: {error}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise SegackValueError(f"{AVRO_SCHEMA} must be an Avro record schema: a value's fields are the "
                               f"event's")
    return parsed


def latest_reader(registry: RegistrySettings, topic: str) -> str | None:
    """The Avro schema ``topic``'s values are resolved to: the latest version of its subject
    ``<topic>-value`` (asked now), or None when the subject has none.

    Raises :class:`OtherFormatError` for a subject of another format, and
    :class:`~segack.spark_adapter.SchemaRegistryError` when the registry does not answer.
    """
    try:
        latest = SchemaRegistry.of(registry).latest(f"{topic}-value")
    except UnknownSchemaError:
        return None
    if latest.schema_type != "AVRO":
        found = _NAMES.get(latest.schema_type, latest.schema_type)
        raise OtherFormatError(f"is of topic {topic}, whose subject {topic}-value holds {found} schemas, "
                               f"not Avro", latest.schema_type)
    return latest.text
