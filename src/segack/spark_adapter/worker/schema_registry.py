"""A Schema Registry's schemas, as records in Confluent's wire format name them by id.

The registry is any server of Confluent's Schema Registry API (Confluent's own, Karapace, Apicurio
in its Confluent mode). segack asks it three things, over HTTP(S) with the standard library:

- ``GET /schemas/types``: the formats it holds, once when a run starts, so that a registry that
  does not answer, refuses segack's credentials or is not a registry at all is found before
  anything runs.
- ``GET /schemas/ids/{id}``: a writer's schema, once per id and process (executors share it
  between their tasks); a Protobuf schema in its serialized form (``?format=serialized``: a
  ``FileDescriptorProto`` in base64), which needs no ``.proto`` parser here.
- ``GET /subjects/{subject}/versions/latest``: the reader's schema for a topic's values (the
  subject ``<topic>-value``, Confluent's default naming).

Its settings are stream options, named as Confluent's serializers name them with the prefix
``schema.registry.`` (:data:`SETTINGS`); ``schema.registry.url`` is ``--schema-registry``'s, one
address or several separated by commas (asked in turn while one does not answer). A password or
token among them is a secret: never printed, never recorded, never sent to another host (segack
follows no redirect).

A registry that does not answer (refused, timed out, cut off, a 5xx, a 408 or a 429) is asked
again three times, 0.5, 1 and 2 s apart, before :class:`~segack.spark_adapter.SchemaRegistryError`;
an id or subject it says it does not hold (its error codes 40401 to 40403) is
:class:`UnknownSchemaError` at once, and an unknown id is not asked again for five minutes. Any
other answer that is not a registry's (a 404 without those codes, a page that is not JSON, JSON
without a schema) is a :class:`~segack.spark_adapter.SchemaRegistryError` at once, saying so.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
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
           "UnknownSchemaError", "registry_settings", "shown_url"]

#: The prefix of every registry setting among a stream's options.
PREFIX = "schema.registry."
#: The registry settings a stream takes, after :data:`PREFIX`: its address, the credentials of
#: basic authentication (``user:password``) or a bearer token, and the PEM file of the CA that
#: signed its certificate (else the system's).
SETTINGS = ("url", "basic.auth.user.info", "bearer.auth.token", "ssl.ca.location")
_RETRIES = (0.5, 1.0, 2.0)
_ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"
#: The registry's error codes for a subject, a version and a schema id it does not hold.
_NOT_HELD = {40401, 40402, 40403}
#: The answers that mean "ask again later": a timeout, too many requests, a server's error.
_TRANSIENT = {408, 429}
#: How long an id the registry said it lacks is not asked again, and how many such ids are kept.
_UNKNOWN_FOR = 300.0
_UNKNOWN_KEPT = 4096


class UnknownSchemaError(SegackError, LookupError):
    """The registry holds no schema of that id, or no subject of that name (its 404 with an error
    code of 40401 to 40403)."""


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema as the registry gives it: ``schema_type`` is ``AVRO``, ``PROTOBUF`` or ``JSON``;
    ``text`` the schema (for Protobuf, the serialized ``FileDescriptorProto`` in base64)."""

    schema_id: int
    schema_type: str
    text: str
    references: tuple[str, ...] = ()


def shown_url(url: str) -> str:
    """``url`` as a message may show it: without the credentials, query or fragment it may hold
    (a password may hold any of ``/?#,:``, so all before the last ``@`` goes)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    rest = rest.rpartition("@")[2]
    return f"{scheme}{separator}{rest.split('#', 1)[0].split('?', 1)[0]}"


def _is_https(address: str) -> bool:
    return urllib.parse.urlsplit(address).scheme == "https"


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is (one address, or several separated by commas) and how to log in; its
    ``repr`` hides the secrets.

    Raises :class:`~segack.spark_adapter.OptionError` for an address that is not ``http://`` or
    ``https://``, holds credentials, a query or a fragment (never shown in the message), for
    ``user_info`` that is not ``USER:PASSWORD``, for both a password and a token, and for a
    ``ca_location`` that names no readable PEM file, or goes with an ``http://`` address.
    """

    url: str
    user_info: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    ca_location: str | None = None

    def __post_init__(self) -> None:
        if "@" in self.url or "?" in self.url or "#" in self.url:
            raise OptionError(f"schema.registry.url must be the registry's address alone, as "
                              f"{shown_url(self.url)}: credentials go in "
                              f"schema.registry.basic.auth.user.info (or schema.registry.bearer.auth.token), "
                              f"never in the address, which is shown")
        for address in self.urls:
            self._check(address)
        for name, secret in (("basic.auth.user.info", self.user_info),
                             ("bearer.auth.token", self.bearer_token)):
            if secret is not None and (not secret or any(ord(char) < 32 or ord(char) == 127
                                                         for char in secret)):
                raise OptionError(f"schema.registry.{name} is empty or holds a line break or another "
                                  f"control character (not shown): give it without")
        if self.user_info is not None and ":" not in self.user_info:
            raise OptionError("schema.registry.basic.auth.user.info must be USER:PASSWORD")
        if self.user_info is not None and self.bearer_token is not None:
            raise OptionError("schema.registry.basic.auth.user.info and schema.registry.bearer.auth.token "
                              "are two ways to log in: give one")
        if self.ca_location is not None:
            self._check_ca(self.ca_location)

    @property
    def urls(self) -> tuple[str, ...]:
        """The registry's addresses, in the order they are asked."""
        return tuple(address.strip().rstrip("/") for address in self.url.split(","))

    def _check(self, address: str) -> None:
        parsed = urllib.parse.urlsplit(address)
        try:
            parsed.port  # noqa: B018  (a port that is not a number raises here)
        except ValueError:
            parsed = parsed._replace(netloc="")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise OptionError(f"schema.registry.url must be an http:// or https:// address, as "
                              f"http://registry:8081, not {address!r}")

    def _check_ca(self, path: str) -> None:
        if not all(_is_https(address) for address in self.urls):
            raise OptionError("schema.registry.ssl.ca.location is the CA of an https:// registry, and "
                              "schema.registry.url is an http:// one: give https://, or leave the CA out")
        if not os.path.isfile(path):
            raise OptionError(f"schema.registry.ssl.ca.location names no file: {path}")
        try:
            ssl.create_default_context(cafile=path)
        except (ssl.SSLError, OSError) as error:
            raise OptionError(f"schema.registry.ssl.ca.location {path} is not a CA's certificate in PEM: "
                              f"{getattr(error, 'reason', None) or error}") from None


def registry_settings(options: Mapping[str, str]) -> tuple[RegistrySettings | None, dict[str, str]]:
    """The registry settings among a stream's ``options`` (None when they name no registry) and the
    other options, for Kafka.

    Raises :class:`~segack.spark_adapter.OptionError` for a ``schema.registry.`` setting that is not
    one of :data:`SETTINGS`, for settings without ``schema.registry.url``, and as
    :class:`RegistrySettings` does.
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
    return RegistrySettings(mine["url"].strip().rstrip("/"), mine.get("basic.auth.user.info"),
                            mine.get("bearer.auth.token"), mine.get("ssl.ca.location")), rest


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: it would carry the credentials to wherever the answer points."""

    def redirect_request(self, *_: Any) -> None:
        return None


class _NoSuchPathError(SchemaRegistryError):
    """A 404 without the registry's error code: a path the server does not have."""


class _TransientError(SegackError):
    """An answer worth asking again for; its text says what it was."""


# What this process has read, by registry and id: a schema once registered never changes. The ids
# a registry said it lacks, with when to ask again; a client per registry.
_SCHEMAS: dict[tuple[RegistrySettings, int], RegisteredSchema] = {}
_UNKNOWN: dict[tuple[RegistrySettings, int], float] = {}
_CLIENTS: dict[RegistrySettings, SchemaRegistry] = {}
_LOCK = threading.Lock()


class SchemaRegistry:
    """A client of the registry ``settings`` name (:mod:`~segack.spark_adapter.worker.schema_registry`)."""

    def __init__(self, settings: RegistrySettings, timeout: float = 10.0) -> None:
        self.settings = settings
        self.timeout = timeout
        handlers: list[Any] = [_NoRedirect]
        if any(_is_https(address) for address in settings.urls):
            try:
                context = ssl.create_default_context(cafile=settings.ca_location)
            except (ssl.SSLError, OSError) as error:  # checked on the driver; an executor may lack it
                raise SchemaRegistryError(
                    f"schema.registry.ssl.ca.location {settings.ca_location} cannot be read on this host "
                    f"({getattr(error, 'strerror', None) or error}): every executor reads it at the same "
                    f"path (ship it with --files, or bake it into the image)") from None
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def of(cls, settings: RegistrySettings) -> SchemaRegistry:
        """This process's client of the registry ``settings`` name, made the first time."""
        with _LOCK:
            client = _CLIENTS.get(settings)
            if client is None:
                client = _CLIENTS[settings] = cls(settings)
        return client

    def formats(self) -> tuple[str, ...]:
        """The schema formats the registry holds (``AVRO``, ``PROTOBUF``, ``JSON``), asked now: what
        a run asks first, so that a registry away, refusing or not a registry stops it at once."""
        path = "/schemas/types"
        try:
            body = self._get(path)
        except _NoSuchPathError:  # Confluent's before 5.5, which holds Avro alone, has no such path
            config = self._get("/config")
            if not isinstance(config, dict) or "compatibilityLevel" not in config:
                raise self._not_a_registry("/config", "a compatibility level") from None
            return ("AVRO",)
        if not isinstance(body, list) or not all(isinstance(kind, str) for kind in body):
            raise self._not_a_registry(path, "a list of formats")
        return tuple(body)

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema of ``schema_id``, from this process's cache after the first time.

        Raises :class:`UnknownSchemaError` for an id the registry lacks (and, for five minutes,
        without asking it again), and :class:`~segack.spark_adapter.SchemaRegistryError` when it
        does not answer.
        """
        key = (self.settings, schema_id)  # by credentials too: one user's 40403 is not another's
        with _LOCK:
            found = _SCHEMAS.get(key)
            again = _UNKNOWN.get(key)
        if found is not None:
            return found
        if again is not None and time.monotonic() < again:
            raise UnknownSchemaError(f"the registry at {shown_url(self.settings.url)} holds no schema "
                                     f"of id {schema_id}")
        path = f"/schemas/ids/{schema_id}"
        try:
            body = self._get(path)
            kind = (body.get("schemaType") or "AVRO") if isinstance(body, dict) else None
            if kind == "PROTOBUF":  # the same schema, serialized: a descriptor Python's protobuf takes as is
                path = f"/schemas/ids/{schema_id}?format=serialized"
                body = self._get(path)
        except UnknownSchemaError:
            with _LOCK:
                if len(_UNKNOWN) >= _UNKNOWN_KEPT:
                    _UNKNOWN.clear()
                _UNKNOWN[key] = time.monotonic() + _UNKNOWN_FOR
            raise
        found = self._registered(path, body, schema_id, kind)
        with _LOCK:
            _SCHEMAS[key] = found
        return found

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version of ``subject``: :class:`UnknownSchemaError` when there is none."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        body = self._get(path)
        schema_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(schema_id, int) or isinstance(schema_id, bool):
            raise self._not_a_registry(path, "a schema and its id")
        return self._registered(path, body, schema_id)

    def _registered(self, path: str, body: Any, schema_id: int, kind: str | None = None) -> RegisteredSchema:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise self._not_a_registry(path, "a schema")
        references = body.get("references") or []
        if not isinstance(references, list) or not all(isinstance(item, dict) for item in references):
            raise self._not_a_registry(path, "a list of references")
        return RegisteredSchema(schema_id, kind or str(body.get("schemaType") or "AVRO"), body["schema"],
                                tuple(str(reference.get("name", "")) for reference in references))

    def _not_a_registry(self, path: str, expected: str) -> SchemaRegistryError:
        return SchemaRegistryError(f"what answers at {shown_url(self.settings.url)} gave GET {path} an "
                                   f"answer without {expected}: is it a Schema Registry?")

    def _get(self, path: str) -> Any:
        """The JSON the registry answers ``GET path`` with, asking each address in turn and all of
        them again after each pause while none answers."""
        reason = ""
        for attempt, pause in enumerate((*_RETRIES, None)):
            for address in self.settings.urls:
                try:
                    return self._ask(address, path)
                except _TransientError as error:
                    reason = str(error)
            if pause is None:
                raise SchemaRegistryError(f"the registry at {shown_url(self.settings.url)} {reason}, asked "
                                          f"{attempt + 1} times for {path}")
            time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _ask(self, address: str, path: str) -> Any:
        """One ``GET`` of ``address`` + ``path``; :class:`_TransientError` for what is worth asking again."""
        shown = shown_url(address)
        request = urllib.request.Request(address + path, headers=self._headers())
        try:
            with self._opener.open(request, timeout=self.timeout) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            with error:
                raise self._refusal(shown, path, error) from None
        except (ssl.SSLError, urllib.error.URLError) as error:
            cause = error.reason if isinstance(error, urllib.error.URLError) else error
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise SchemaRegistryError(self._untrusted(shown, cause)) from None
            if isinstance(cause, ssl.SSLError) and "WRONG_VERSION_NUMBER" in str(cause):
                raise SchemaRegistryError(f"the registry at {shown} does not speak TLS: is its address "
                                          f"http://?") from None
            raise _TransientError(f"did not answer ({cause})") from None
        except (OSError, http.client.HTTPException) as error:  # reset, timed out, cut off mid-answer
            raise _TransientError(f"did not answer ({type(error).__name__}: {error})") from None
        except ValueError:  # http.client's refusal of a header: its text would show the credentials
            raise SchemaRegistryError(f"the request to the registry at {shown} could not be sent: a header "
                                      f"segack was given (not shown) is not one HTTP takes") from None
        try:
            return json.loads(text)
        except ValueError:
            raise SchemaRegistryError(f"what answers at {shown} gave GET {path} something that is not "
                                      f"JSON: is it a Schema Registry?") from None

    def _refusal(self, shown: str, path: str, error: urllib.error.HTTPError) -> Exception:
        code = error.code
        if 300 <= code < 400:
            where = shown_url(error.headers.get("Location") or "elsewhere")
            return SchemaRegistryError(f"the registry at {shown} answered GET {path} with a redirect "
                                       f"({code}) to {where}: give that address as --schema-registry (segack "
                                       f"follows no redirect, which would carry its credentials along)")
        if code in (401, 403):
            return SchemaRegistryError(f"the registry at {shown} refused segack's credentials ({code}): "
                                       f"check schema.registry.basic.auth.user.info or "
                                       f"schema.registry.bearer.auth.token")
        if code in _TRANSIENT or code >= 500:
            return _TransientError(f"answered {code}")
        error_code = None
        try:
            text = error.read()
        except (OSError, http.client.HTTPException):  # cut off: the next ask may get it whole
            return _TransientError(f"answered {code}, cut off")
        try:
            body = json.loads(text)
            error_code = body.get("error_code") if isinstance(body, dict) else None
        except ValueError:
            pass  # a 4xx that is not a registry's JSON: told below as not a registry's answer
        if code == 404 and error_code in _NOT_HELD:
            return UnknownSchemaError(f"the registry at {shown} holds no {path}")
        if code == 404:
            return _NoSuchPathError(f"what answers at {shown} has no {path} (404 without a registry's "
                                       f"error code): is it a Schema Registry?")
        return SchemaRegistryError(f"the registry at {shown} answered {code} to GET {path}")

    def _untrusted(self, shown: str, cause: ssl.SSLCertVerificationError) -> str:
        why = cause.verify_message or cause.reason or cause
        if "hostname" in str(why).lower() or "ip address mismatch" in str(why).lower():
            return (f"the registry at {shown} shows a certificate that is not for its address ({why}): "
                    f"give the address its certificate names")
        if self.settings.ca_location is None:
            return (f"the registry at {shown} is not trusted ({why}): give the PEM file of the CA that "
                    f"signed its certificate as schema.registry.ssl.ca.location")
        return (f"the registry at {shown} is not trusted ({why}) by the CA in "
                f"schema.registry.ssl.ca.location ({self.settings.ca_location}): give the CA that signed "
                f"its certificate")

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": _ACCEPT}
        if self.settings.user_info is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(self.settings.user_info.encode()).decode()
        elif self.settings.bearer_token is not None:
            headers["Authorization"] = "Bearer " + self.settings.bearer_token
        return headers
