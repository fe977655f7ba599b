"""Which decoder a Kafka stream's value format needs, checked before anything runs.

``json`` needs none (Spark parses it in micro-batches, Python in real time). ``avro``,
``protobuf`` and ``json-schema`` are Confluent's wire format, decoded through the Schema Registry the
stream's ``schema.registry.*`` options name
(:class:`~segack.spark_adapter.worker.wire_format.WireFormat`). When the run starts, the driver
asks the registry whether it answers and holds the format, and for Avro each known topic's reader
schema, unless the option ``avroSchema`` gives the one reader (as Spark's ``from_avro`` takes it).
``avro`` with ``avroSchema`` and no registry is plain binary Avro, as Spark's ``to_avro`` writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from segack.errors import SegackValueError
from segack.spark_adapter.errors import InputError, OptionError, SchemaRegistryError
from segack.spark_adapter.worker.schema_registry import (
    RegistrySettings,
    SchemaRegistry,
    registry_settings,
    shown_url,
)
from segack.spark_adapter.worker.wire_format import (
    AVRO_SCHEMA,
    REGISTRY_FORMATS,
    OtherFormatError,
    WireFormat,
    avro_schema,
    latest_reader,
)

__all__ = ["VALUE_FORMATS", "known_topics", "reader_schemas", "value_registry", "wire_format"]

#: The value formats a record's value is parsed from: JSON text, or Confluent's wire format
#: through a Schema Registry (:mod:`~segack.spark_adapter.worker.wire_format`).
VALUE_FORMATS = ("json", *REGISTRY_FORMATS)


def known_topics(options: Mapping[str, str]) -> list[str]:
    """The topics a Kafka reader's ``options`` name: ``subscribe``'s list, or the topics of
    ``assign``'s JSON; none for ``subscribePattern`` (whose topics are found as its records come)."""
    if "assign" in options:
        try:
            assigned = json.loads(options["assign"])
        except ValueError:
            return []  # Spark's own reader refuses it, saying why
        return sorted(assigned) if isinstance(assigned, dict) else []
    return [topic.strip() for topic in str(options.get("subscribe", "")).split(",") if topic.strip()]


def reader_schemas(registry: RegistrySettings, value_format: str,
                   topics: Sequence[str]) -> dict[str, str | None]:
    """Asks the registry, before a run starts, whether it answers and holds ``value_format``'s
    schemas; for Avro, the schema each of ``topics``' values is resolved to (its subject's latest
    version, :func:`~segack.spark_adapter.worker.wire_format.latest_reader`; None where the subject
    has none). Empty for another format.

    Raises :class:`~segack.spark_adapter.InputError` when the registry does not answer, refuses
    segack's credentials, is not a registry, does not hold the format, or holds another format's
    schemas under a topic's subject.
    """
    client = SchemaRegistry.of(registry)
    try:
        formats = client.formats()
        if REGISTRY_FORMATS[value_format] not in formats:
            raise InputError(f"the registry at {shown_url(registry.url)} holds no {value_format} schemas "
                             f"(it holds {', '.join(formats) or 'none'})")
        if value_format != "avro":
            return {}
        return {topic: latest_reader(registry, topic) for topic in topics}
    except OtherFormatError as error:
        raise InputError(f"the values {error}: give --value-format "
                         f"{_FORMAT_OF.get(error.schema_type, 'json')}") from None
    except SchemaRegistryError as error:
        raise InputError(str(error)) from None


_FORMAT_OF = {kind: name for name, kind in REGISTRY_FORMATS.items()}


def value_registry(options: Mapping[str, str],
                   value_format: str) -> tuple[RegistrySettings | None, dict[str, str]]:
    """The registry settings among ``options`` that ``value_format`` reads through (None for JSON,
    and for plain Avro), and the other options but ``avroSchema``; checked with no network.

    Raises :class:`~segack.spark_adapter.OptionError` for a value format that is not one of
    :data:`VALUE_FORMATS`, a registry format without a registry (Avro: nor ``avroSchema``),
    registry settings with JSON, a registry setting segack does not take, an ``avroSchema`` with
    another format than Avro or that is not an Avro record schema.
    """
    if value_format not in VALUE_FORMATS:
        raise OptionError(f"value format must be one of {', '.join(VALUE_FORMATS)}, not {value_format!r}")
    registry, rest = registry_settings(options)
    reader = rest.pop(AVRO_SCHEMA, None)
    if reader is not None and value_format != "avro":
        raise OptionError(f"{AVRO_SCHEMA} is the schema Avro values are read by: give --value-format avro, "
                          f"or leave it out")
    if reader is not None:
        try:
            avro_schema(reader)
        except SegackValueError as error:
            raise OptionError(str(error)) from None
    if value_format == "json" and registry is not None:
        raise OptionError("a Schema Registry is for values in Confluent's wire format: give --value-format "
                          "avro, protobuf or json-schema, or leave out --schema-registry")
    if value_format != "json" and registry is None and reader is None:
        plain = " (or, for plain binary Avro with no header, its schema: --avro-schema FILE)"
        raise OptionError(f"--value-format {value_format} reads each value's schema from a Schema Registry: "
                          f"give --schema-registry URL{plain if value_format == 'avro' else ''}")
    return registry, rest


def wire_format(options: Mapping[str, str], value_format: str,
                topics: Sequence[str]) -> tuple[WireFormat | None, dict[str, str]]:
    """The decoder of ``value_format`` that ``options``' registry settings and ``avroSchema`` make
    (None for JSON), its Avro reader schemas asked of the registry for ``topics``
    (:func:`reader_schemas`) unless ``avroSchema`` gives the one, and the options without the
    registry's and ``avroSchema``.

    Raises :class:`~segack.spark_adapter.OptionError` as :func:`value_registry` does, and
    :class:`~segack.spark_adapter.InputError` when the registry does not answer or refuses
    segack's credentials.
    """
    registry, rest = value_registry(options, value_format)
    reader = options.get(AVRO_SCHEMA)
    if registry is None:
        return (None if reader is None else WireFormat(value_format, None, reader=reader)), rest
    readers = reader_schemas(registry, value_format, [] if reader is not None else topics)
    return WireFormat(value_format, registry, readers, reader), rest
