"""Values in Confluent's wire format, decoded by their own writer's schema.

A value in the wire format is a magic byte ``0``, its writer schema's id in the registry (4 bytes,
big-endian), then the payload:

- **Avro**: the record in Avro's binary encoding, read with the writer's schema and resolved to
  the reader's (the subject's latest when the run started, :class:`WireFormat` ``readers``), so a
  field an older writer lacks takes its default and one a newer writer added is dropped; a topic
  whose records hold several writer versions decodes in one batch, and a version registered while
  the stream runs is read without a restart.
- **Protobuf**: the message indexes (a zigzag varint count, then that many zigzag varints, the
  path of the message type in the ``.proto`` file; a count of ``0`` means the first type), then the
  message. Read with the writer's descriptor; a field of a message type is a dict, a repeated one a
  list, an enum its name.
- **JSON Schema**: the value as JSON text.

Each writer's schema is asked of the registry once per process (executors share it between
tasks) and parsed once. :meth:`WireFormat.decode` gives the value as a dict, the same one a JSON
object gives, or raises :class:`UndecodableValueError` saying why: not in the wire format (the first byte is
not ``0``, or there are fewer than five), an id the registry does not hold, a schema of another
format, a payload the schema does not read. Bytes are given as base64 text.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from segack.errors import SegackValueError
from segack.spark_adapter.worker.schema_registry import RegistrySettings, SchemaRegistry, UnknownSchemaError

__all__ = ["REGISTRY_FORMATS", "UndecodableValueError", "WireFormat", "message_indexes"]

#: The value formats whose values are in Confluent's wire format, and the registry's name for each.
REGISTRY_FORMATS = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}
_NAMES = {"AVRO": "Avro", "PROTOBUF": "Protobuf", "JSON": "JSON Schema"}
_HEADER = struct.Struct(">bI")

# Parsed writers' schemas by (registry, id, and for Protobuf the message's path): what a process
# parses once and every task of it reads.
_PARSED: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


class UndecodableValueError(SegackValueError):
    """A value the format does not decode; its message says why."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The zigzag varint at ``at`` and the index after it."""
    shift = result = 0
    while True:
        if at >= len(data) or shift > 63:
            raise UndecodableValueError("has Protobuf message indexes that end before they do")
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


def _protobuf_class(schema_text: str, indexes: tuple[int, ...], references: tuple[str, ...]) -> Any:
    """The message class at ``indexes`` of a serialized ``FileDescriptorProto``."""
    # The well-known types a schema may import, in the default pool to be copied from it.
    from google.protobuf import (  # noqa: F401
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        message_factory,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_text))
    pool = descriptor_pool.DescriptorPool()
    known = descriptor_pool.Default()
    for dependency in proto.dependency:
        try:
            pool.AddSerializedFile(known.FindFileByName(dependency).serialized_pb)
        except KeyError:
            raise UndecodableValueError(f"has a schema that imports {dependency!r} from the registry "
                              f"(references {', '.join(references) or 'none'}), which segack does not "
                              f"read yet: only Google's well-known types") from None
    pool.Add(proto)
    types = proto.message_type
    names = []
    for index in indexes:
        if index >= len(types):
            raise UndecodableValueError(
                f"has Protobuf message indexes {list(indexes)} that name no message of "
                f"its schema")
        names.append(types[index].name)
        types = types[index].nested_type
    full_name = ".".join(filter(None, (proto.package, *names)))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


@dataclass(frozen=True)
class WireFormat:
    """Decodes values of ``value_format`` (a key of :data:`REGISTRY_FORMATS`) written through the
    registry ``registry``. ``readers`` holds, per topic, the Avro schema (JSON text) its values are
    resolved to; a topic without one is read by each writer's own schema."""

    value_format: str
    registry: RegistrySettings
    readers: Mapping[str, str] = field(default_factory=dict)

    def decode(self, topic: str, value: bytes) -> dict[str, Any]:
        """The value of a record of ``topic`` as a dict, or :class:`UndecodableValueError`; a registry that
        does not answer is a :class:`~segack.spark_adapter.SchemaRegistryError`."""
        if len(value) < _HEADER.size or value[0] != 0:
            first = f"0x{value[0]:02x}" if value else "nothing"
            raise UndecodableValueError(
                f"is not in Confluent's wire format (it starts with {first}, not the magic "
                f"byte 0x00 and a schema id)")
        _, schema_id = _HEADER.unpack_from(value)
        payload = memoryview(value)[_HEADER.size:]
        if self.value_format == "avro":
            return self._avro(topic, schema_id, payload)
        if self.value_format == "protobuf":
            return self._protobuf(schema_id, bytes(payload))
        return self._json(schema_id, payload)

    def _writer(self, schema_id: int) -> Any:
        try:
            schema = SchemaRegistry(self.registry).schema(schema_id)
        except UnknownSchemaError:
            raise UndecodableValueError(
                f"names schema id {schema_id}, which the registry at {self.registry.url} "
                f"does not hold") from None
        expected = REGISTRY_FORMATS[self.value_format]
        if schema.schema_type != expected:
            found = _NAMES.get(schema.schema_type, schema.schema_type)
            raise UndecodableValueError(
                f"names schema id {schema_id}, whose schema is {found}, not {_NAMES[expected]}")
        return schema

    def _avro(self, topic: str, schema_id: int, payload: memoryview) -> dict[str, Any]:
        import fastavro

        reader_text = self.readers.get(topic)
        key = (self.registry.url, schema_id, reader_text)
        with _LOCK:
            parsed = _PARSED.get(key)
        if parsed is None:
            writer = fastavro.parse_schema(json.loads(self._writer(schema_id).text))
            reader = None if reader_text is None else fastavro.parse_schema(json.loads(reader_text))
            # A writer without bytes gives a record with none to turn into text: no walk through it.
            has_bytes = any(kind in self._writer(schema_id).text for kind in ('"bytes"', '"fixed"'))
            parsed = (writer, None if reader == writer else reader, has_bytes)
            with _LOCK:
                _PARSED[key] = parsed
        try:
            record = fastavro.schemaless_reader(io.BytesIO(payload), parsed[0], parsed[1])
        except Exception as error:  # fastavro raises what the bytes make it: EOFError, ValueError, ...
            raise UndecodableValueError(f"does not decode as Avro by schema id {schema_id}: "
                              f"{type(error).__name__}: {error}") from None
        if not isinstance(record, dict):
            raise UndecodableValueError(
                f"decodes by schema id {schema_id} as {type(record).__name__}, not a record")
        return _avro_value(record) if parsed[2] else record

    def _protobuf(self, schema_id: int, payload: bytes) -> dict[str, Any]:
        from google.protobuf.message import DecodeError

        try:
            indexes, start = message_indexes(payload)
        except UndecodableValueError:
            self._writer(schema_id)  # a schema of another format says so first
            raise
        key = (self.registry.url, schema_id, indexes)
        with _LOCK:
            message_class = _PARSED.get(key)
        if message_class is None:
            schema = self._writer(schema_id)
            message_class = _protobuf_class(schema.text, indexes, schema.references)
            with _LOCK:
                _PARSED[key] = message_class
        try:
            return _message_dict(message_class.FromString(payload[start:]))
        except DecodeError as error:
            raise UndecodableValueError(
                f"does not decode as Protobuf message {message_class.DESCRIPTOR.full_name} of "
                f"schema id {schema_id}: {error}") from None

    def _json(self, schema_id: int, payload: memoryview) -> dict[str, Any]:
        key = (self.registry.url, schema_id, "json")
        with _LOCK:
            known = key in _PARSED
        if not known:
            self._writer(schema_id)
            with _LOCK:
                _PARSED[key] = True
        try:
            value = json.loads(bytes(payload))
        except (ValueError, RecursionError) as error:
            raise UndecodableValueError(
                f"is not JSON after its header (schema id {schema_id}): {error}") from None
        if not isinstance(value, dict):
            raise UndecodableValueError(
                f"is JSON {type(value).__name__}, not an object (schema id {schema_id})")
        return value
