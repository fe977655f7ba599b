"""Which decoder a Kafka stream's value format needs, checked before anything runs.

``json`` needs none (Spark parses it in micro-batches, Python in real time). ``avro``,
``protobuf`` and ``json-schema`` are Confluent's wire format, decoded through the Schema Registry the
stream's ``schema.registry.*`` options name
(:class:`~segack.spark_adapter.worker.wire_format.WireFormat`); for Avro the driver asks the
registry, when the run starts, for each subscribed topic's reader schema.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from segack.spark_adapter.errors import InputError, OptionError, SchemaRegistryError
from segack.spark_adapter.worker.schema_registry import (
    RegistrySettings,
    SchemaRegistry,
    UnknownSchemaError,
    registry_settings,
)
from segack.spark_adapter.worker.wire_format import REGISTRY_FORMATS, WireFormat

__all__ = ["VALUE_FORMATS", "reader_schemas", "value_registry", "wire_format"]

#: The value formats a record's value is parsed from: JSON text, or Confluent's wire format
#: through a Schema Registry (:mod:`~segack.spark_adapter.worker.wire_format`).
VALUE_FORMATS = ("json", *REGISTRY_FORMATS)


def reader_schemas(registry: RegistrySettings, value_format: str, topics: Sequence[str]) -> dict[str, str]:
    """The Avro schema each of ``topics``' values is resolved to: its subject's (``<topic>-value``)
    latest version, asked now; a topic whose subject has none is read by each writer's schema.
    Empty for another format.

    Raises :class:`~segack.spark_adapter.InputError` when the registry does not answer or refuses.
    """
    if value_format != "avro":
        return {}
    readers = {}
    client = SchemaRegistry(registry)
    try:
        for topic in topics:
            with contextlib.suppress(UnknownSchemaError):
                latest = client.latest(f"{topic}-value")
                if latest.schema_type != "AVRO":
                    raise InputError(f"the registry's subject {topic}-value holds {latest.schema_type} "
                                     f"schemas, not Avro: give --value-format "
                                     f"{_FORMAT_OF.get(latest.schema_type, 'json')}")
                readers[topic] = latest.text
    except SchemaRegistryError as error:
        raise InputError(str(error)) from None
    return readers


_FORMAT_OF = {kind: name for name, kind in REGISTRY_FORMATS.items()}


def value_registry(options: Mapping[str, str],
                   value_format: str) -> tuple[RegistrySettings | None, dict[str, str]]:
    """The registry settings among ``options`` that ``value_format`` reads through (None for JSON),
    and the other options; checked with no network.

    Raises :class:`~segack.spark_adapter.OptionError` for a value format that is not one of
    :data:`VALUE_FORMATS`, a registry format without a
    registry, registry settings with JSON, a registry setting segack does not take.
    """
    if value_format not in VALUE_FORMATS:
        raise OptionError(f"value format must be one of {', '.join(VALUE_FORMATS)}, not {value_format!r}")
    registry, rest = registry_settings(options)
    if value_format == "json" and registry is not None:
        raise OptionError("a Schema Registry is for values in Confluent's wire format: give --value-format "
                          "avro, protobuf or json-schema, or leave out --schema-registry")
    if value_format != "json" and registry is None:
        raise OptionError(f"--value-format {value_format} reads each value's schema from a Schema Registry: "
                          f"give --schema-registry URL")
    return registry, rest


def wire_format(options: Mapping[str, str], value_format: str,
                topics: Sequence[str]) -> tuple[WireFormat | None, dict[str, str]]:
    """The decoder of ``value_format`` that ``options``' registry settings make (None for JSON), its
    Avro reader schemas asked of the registry for ``topics`` (:func:`reader_schemas`), and the
    options without the registry's.

    Raises :class:`~segack.spark_adapter.OptionError` as :func:`value_registry` does, and
    :class:`~segack.spark_adapter.InputError` when the registry does not answer or refuses
    segack's credentials.
    """
    registry, rest = value_registry(options, value_format)
    if registry is None:
        return None, rest
    return WireFormat(value_format, registry, reader_schemas(registry, value_format, topics)), rest
