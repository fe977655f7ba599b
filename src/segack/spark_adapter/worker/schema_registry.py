"""A Schema Registry's schemas, as records in Confluent's wire format name them by id.

The registry is any server of Confluent's Schema Registry API (Confluent's own, Karapace, Apicurio
in its Confluent mode). segack asks it two things, over HTTP(S) with the standard library:

- ``GET /schemas/ids/{id}``: a writer's schema, once per id and process (executors share it
  between their tasks); a Protobuf schema in its serialized form (``?format=serialized``: a
  ``FileDescriptorProto`` in base64), which needs no ``.proto`` parser here.
- ``GET /subjects/{subject}/versions/latest``: the reader's schema for a topic's values when a run
  starts (the subject ``<topic>-value``, Confluent's default naming).

Its settings are stream options, named as Confluent's serializers name them with the prefix
``schema.registry.`` (:data:`SETTINGS`); ``schema.registry.url`` is ``--schema-registry``'s. A
password or token among them is a secret: never printed, never recorded.

A registry that does not answer (refused, timed out, a 5xx) is asked again three times, 0.5, 1 and
2 s apart, before :class:`~segack.spark_adapter.SchemaRegistryError`; an id or subject it does not
hold is :class:`UnknownSchemaError`, at once.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from segack.errors import SegackError
from segack.spark_adapter.errors import OptionError, SchemaRegistryError

__all__ = ["PREFIX", "SETTINGS", "RegisteredSchema", "RegistrySettings", "SchemaRegistry",
           "UnknownSchemaError", "registry_settings"]

#: The prefix of every registry setting among a stream's options.
PREFIX = "schema.registry."
#: The registry settings a stream takes, after :data:`PREFIX`: its address, the credentials of
#: basic authentication (``user:password``) or a bearer token, and the PEM file of the CA that
#: signed its certificate (else the system's).
SETTINGS = ("url", "basic.auth.user.info", "bearer.auth.token", "ssl.ca.location")
_RETRIES = (0.5, 1.0, 2.0)
_ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"


class UnknownSchemaError(SegackError, LookupError):
    """The registry holds no schema of that id, or no subject of that name (its 404)."""


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema as the registry gives it: ``schema_type`` is ``AVRO``, ``PROTOBUF`` or ``JSON``;
    ``text`` the schema (for Protobuf, the serialized ``FileDescriptorProto`` in base64)."""

    schema_id: int
    schema_type: str
    text: str
    references: tuple[str, ...] = ()


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is and how to log in; its ``repr`` hides the secrets."""

    url: str
    user_info: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    ca_location: str | None = None

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise OptionError(f"schema.registry.url must be an http:// or https:// address, as "
                              f"http://registry:8081, not {self.url!r}")
        if parsed.username or parsed.password:
            raise OptionError("schema.registry.url must not hold credentials, which it would show: give them "
                              "as schema.registry.basic.auth.user.info=USER:PASSWORD")
        if self.user_info is not None and ":" not in self.user_info:
            raise OptionError("schema.registry.basic.auth.user.info must be USER:PASSWORD")
        if self.user_info is not None and self.bearer_token is not None:
            raise OptionError("schema.registry.basic.auth.user.info and schema.registry.bearer.auth.token "
                              "are two ways to log in: give one")


def registry_settings(options: Mapping[str, str]) -> tuple[RegistrySettings | None, dict[str, str]]:
    """The registry settings among a stream's ``options`` (None when they name no registry) and the
    other options, for Kafka.

    Raises :class:`~segack.spark_adapter.OptionError` for a ``schema.registry.`` setting that is not
    one of :data:`SETTINGS`, and for settings without ``schema.registry.url``.
    """
    mine = {name[len(PREFIX):]: value for name, value in options.items() if name.startswith(PREFIX)}
    rest = {name: value for name, value in options.items() if not name.startswith(PREFIX)}
    unknown = sorted(set(mine) - set(SETTINGS))
    if unknown:
        raise OptionError(f"{PREFIX}{unknown[0]} is not a registry setting segack takes; it takes "
                          f"{', '.join(PREFIX + name for name in SETTINGS)}")
    if not mine:
        return None, rest
    if "url" not in mine:
        raise OptionError(f"registry settings without its address: give --schema-registry URL "
                          f"(or {PREFIX}url)")
    return RegistrySettings(mine["url"].rstrip("/"), mine.get("basic.auth.user.info"),
                            mine.get("bearer.auth.token"), mine.get("ssl.ca.location")), rest


# What this process has read, by registry and id: a schema once registered never changes.
_SCHEMAS: dict[tuple[str, int], RegisteredSchema] = {}
_LOCK = threading.Lock()


class SchemaRegistry:
    """A client of the registry ``settings`` name (:mod:`~segack.spark_adapter.worker.schema_registry`)."""

    def __init__(self, settings: RegistrySettings, timeout: float = 10.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=settings.ca_location) if (
            settings.url.startswith("https:")) else None

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema of ``schema_id``, from this process's cache after the first time.

        Raises :class:`UnknownSchemaError` for an id the registry lacks, and
        :class:`~segack.spark_adapter.SchemaRegistryError` when it does not answer.
        """
        key = (self.settings.url, schema_id)
        with _LOCK:
            found = _SCHEMAS.get(key)
        if found is not None:
            return found
        body = self._get(f"/schemas/ids/{schema_id}")
        kind = body.get("schemaType") or "AVRO"
        if kind == "PROTOBUF":  # the same schema, serialized: a descriptor Python's protobuf takes as is
            body = self._get(f"/schemas/ids/{schema_id}?format=serialized")
        found = RegisteredSchema(schema_id, kind, body["schema"], tuple(
            reference.get("name", "") for reference in body.get("references") or ()))
        with _LOCK:
            _SCHEMAS[key] = found
        return found

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version of ``subject``: :class:`UnknownSchemaError` when there is none."""
        body = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest")
        return RegisteredSchema(int(body["id"]), body.get("schemaType") or "AVRO", body["schema"], tuple(
            reference.get("name", "") for reference in body.get("references") or ()))

    def _get(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.settings.url + path, headers=self._headers())
        for attempt, pause in enumerate((*_RETRIES, None)):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as answer:
                    body: dict[str, Any] = json.loads(answer.read())
                    return body
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    raise UnknownSchemaError(f"the registry at {self.settings.url} holds no {path}") from None
                if error.code in (401, 403):
                    raise SchemaRegistryError(f"the registry at {self.settings.url} refused segack's "
                                              f"credentials ({error.code}): check "
                                              f"schema.registry.basic.auth.user.info or "
                                              f"schema.registry.bearer.auth.token") from None
                reason = f"answered {error.code}"
                if error.code < 500:
                    raise SchemaRegistryError(f"the registry at {self.settings.url} {reason} to GET "
                                              f"{path}") from None
            except ssl.SSLError as error:
                raise SchemaRegistryError(f"the registry at {self.settings.url} is not trusted: "
                                          f"{error.reason or error}; give its CA's PEM file as "
                                          f"schema.registry.ssl.ca.location") from None
            except (urllib.error.URLError, OSError, ValueError) as error:
                reason = f"did not answer ({getattr(error, 'reason', error)})"
            if pause is None:
                raise SchemaRegistryError(f"the registry at {self.settings.url} {reason}, asked "
                                          f"{attempt + 1} times for {path}")
            time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": _ACCEPT}
        if self.settings.user_info is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(self.settings.user_info.encode()).decode()
        elif self.settings.bearer_token is not None:
            headers["Authorization"] = "Bearer " + self.settings.bearer_token
        return headers
