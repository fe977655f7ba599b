"""A Kafka cluster's client settings in one spelling for every part of segack.

Spark's Kafka connector and the driver's admin client are Kafka's Java client; real-time tasks,
the driver's group commits and :class:`~segack.sinks.KafkaSink` are librdkafka's
(``confluent-kafka``). The two name how to reach a secured cluster differently: the Java client
takes a JAAS line (``sasl.jaas.config``), trust and key stores (``ssl.truststore.*``,
``ssl.keystore.*``); librdkafka takes ``sasl.username``, ``ssl.ca.location`` and the like. A user
writes either spelling, once (the ``kafka.*`` options, without their prefix here); each client is
given its own:

1. **Read.** The security settings, in either spelling, are read into one :class:`Security`: how
   the client logs in (a password, an OAuth token, Kerberos), which certificates it trusts, which it
   shows, whether it checks the broker's host name. A thing said twice (a JAAS line and
   ``sasl.username``) or a setting either client would read otherwise than meant (a JKS store for
   librdkafka, a login module librdkafka has no twin of) is refused, naming the setting and what to
   write instead.
2. **Written** for each client (:func:`java_settings`, :func:`librdkafka_settings`): the security
   settings in its spelling, every other setting as given (``bootstrap.servers``,
   ``security.protocol``, ``sasl.mechanism`` and the tuning ones are alike, or one client's own).

:func:`redacted` hides what must never be printed or recorded: passwords, secrets, keys and JAAS
lines, in either spelling.

The translation, both ways, is the table of the docs' "Connecting to your cluster" page
(``docs/connecting.rst``). Java key and trust stores (JKS), PKCS12 trust stores and AWS MSK's IAM
login module have no librdkafka twin: they are refused where librdkafka needs them, saying how to
convert them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from segack.spark_adapter.errors import OptionError

__all__ = ["REDACTED", "ClientLog", "Security", "java_options", "java_settings", "librdkafka_client",
           "librdkafka_settings", "read_security", "redacted", "secret_setting", "security_failure"]

#: What a secret setting's value is shown as.
REDACTED = "*****"
#: Setting names whose values are secrets, in either spelling (any ``*.password``, ``*.secret`` and
#: the others below, with or without the ``kafka.`` prefix).
_SECRET = re.compile(r"(^|\.)(password|secret|jaas\.config|oauthbearer\.config|key|pem|token|user\.info)$")

_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
_KERBEROS = "com.sun.security.auth.module.Krb5LoginModule"
_MSK_IAM = "software.amazon.msk.auth.iam.IAMLoginModule"
#: A JAAS line: ``<login module class> <flag> name=value ... ;``, a value bare or double-quoted.
_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)"
                   r"(?P<options>(?:\s+[\w.-]+\s*=\s*(?:\"(?:[^\"\\]|\\.)*\"|[^\s;\"]+))*)\s*;\s*")
_JAAS_OPTION = re.compile(r"([\w.-]+)\s*=\s*(?:\"((?:[^\"\\]|\\.)*)\"|([^\s;\"]+))")

#: librdkafka's names for the security settings :class:`Security` reads (the Java client's are in
#: :data:`_JAVA_NAMES`); each is consumed and written again in the other client's spelling.
_LIBRDKAFKA_NAMES = frozenset({
    "sasl.username", "sasl.password", "enable.sasl.oauthbearer.unsecure.jwt", "sasl.oauthbearer.config",
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope", "sasl.kerberos.keytab", "sasl.kerberos.principal", "ssl.ca.location",
    "ssl.ca.pem", "ssl.certificate.location", "ssl.key.location", "ssl.certificate.pem", "ssl.key.pem"})
_JAVA_NAMES = frozenset({
    "sasl.jaas.config", "sasl.login.callback.handler.class", "ssl.truststore.location",
    "ssl.truststore.type", "ssl.truststore.password", "ssl.truststore.certificates", "ssl.keystore.type",
    "ssl.keystore.certificate.chain", "ssl.keystore.key"})
#: Names alike in both clients that :class:`Security` reads: they are written again for each.
_SHARED_NAMES = frozenset({"ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
                           "ssl.endpoint.identification.algorithm", "sasl.oauthbearer.token.endpoint.url"})


def secret_setting(name: str) -> bool:
    """Whether the setting ``name`` (a Kafka client's, with or without ``kafka.``) holds a secret."""
    return bool(_SECRET.search(name.lower()))


def redacted(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with each secret's value (:func:`secret_setting`) shown as :data:`REDACTED`."""
    return {name: REDACTED if secret_setting(name) else value for name, value in settings.items()}


@dataclass(frozen=True)
class Login:
    """How a client logs in over SASL, whichever spelling said it."""

    #: ``password`` (PLAIN, SCRAM), ``unsecured`` (an unsigned OAuth token: tests), ``oidc`` (OAuth
    #: client credentials) or ``kerberos``.
    kind: str
    #: The login's values: ``username`` and ``password``; ``principal`` (and ``extensions``, each
    #: ``name=value``); ``client_id``, ``client_secret`` and ``scope``; ``keytab`` and ``principal``.
    values: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Security:
    """A cluster's security settings, read from either spelling (step 1)."""

    login: Login | None = None
    #: The certificates trusted: ``("file", path)`` or ``("pem", text)``, PEM either way.
    trust: tuple[str, str] | None = None
    #: The certificate shown: ``("pkcs12", path)``, ``("pem-file", path)`` (key and chain in one file),
    #: ``("pem-files", certificate path, key path)`` or ``("pem", certificate text, key text)``.
    identity: tuple[str, ...] | None = None
    #: The PKCS12 store's password, and the private key's.
    store_password: str | None = None
    key_password: str | None = None
    #: Whether the broker's host name is checked against its certificate (None: the client's default,
    #: which checks, in both).
    check_host: bool | None = None
    #: OAuth's token endpoint (the same name in both clients).
    token_endpoint: str | None = None


def _one_of(settings: Mapping[str, str], *names: str) -> None:
    given = [name for name in names if name in settings]
    if len(given) > 1:
        raise OptionError(f"kafka.{given[0]} and kafka.{given[1]} say the same thing twice: give one of them")


def _jaas(line: str) -> tuple[str, dict[str, str]]:
    """The login module and options of a JAAS line; refused if it is not one."""
    match = _JAAS.fullmatch(line)
    if match is None:
        raise OptionError("kafka.sasl.jaas.config is not a JAAS line: write it as "
                          "'<login module class> required name=\"value\" ...;'")
    options = {name: bare if quoted is None else re.sub(r"\\(.)", r"\1", quoted)
               for name, quoted, bare in _JAAS_OPTION.findall(match["options"])}
    return match["module"], options


def _login_from_jaas(line: str, settings: Mapping[str, str]) -> Login:
    module, options = _jaas(line)
    mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "GSSAPI")).upper()
    if module in (_PLAIN, _SCRAM):
        if options.get("tokenauth", "false").lower() == "true":
            raise OptionError("kafka.sasl.jaas.config logs in with a delegation token (tokenauth=true), "
                              "which librdkafka cannot: log in with a user's password")
        missing = [name for name in ("username", "password") if name not in options]
        if missing:
            raise OptionError(f"kafka.sasl.jaas.config's {module.rsplit('.', 1)[1]} lacks {missing[0]}")
        expected = ("PLAIN",) if module == _PLAIN else ("SCRAM-SHA-256", "SCRAM-SHA-512")
        if mechanism not in expected:
            raise OptionError(f"kafka.sasl.jaas.config's {module.rsplit('.', 1)[1]} logs in with "
                              f"{' or '.join(expected)}: give kafka.sasl.mechanism={expected[-1]}")
        return Login("password", {"username": options["username"], "password": options["password"]})
    if module == _OAUTH:
        if "unsecuredLoginStringClaim_sub" in options:
            extensions = ",".join(f"{name.removeprefix('unsecuredLoginExtension_')}={value}"
                                  for name, value in options.items()
                                  if name.startswith("unsecuredLoginExtension_"))
            return Login("unsecured", {"principal": options["unsecuredLoginStringClaim_sub"],
                                       "extensions": extensions})
        if "clientId" in options and "clientSecret" in options:
            return Login("oidc", {"client_id": options["clientId"], "client_secret": options["clientSecret"],
                                  "scope": options.get("scope", "")})
        raise OptionError("kafka.sasl.jaas.config's OAuthBearerLoginModule names no token: give it "
                          "clientId=\"..\" clientSecret=\"..\" with "
                          "kafka.sasl.oauthbearer.token.endpoint.url "
                          "(OIDC), or unsecuredLoginStringClaim_sub=\"..\" (an unsigned token, for tests)")
    if module == _KERBEROS:
        if "keyTab" not in options or "principal" not in options:
            raise OptionError("kafka.sasl.jaas.config's Krb5LoginModule must give keyTab and principal "
                              "(librdkafka logs in from a keytab)")
        return Login("kerberos", {"keytab": options["keyTab"], "principal": options["principal"]})
    if module == _MSK_IAM:
        raise OptionError("kafka.sasl.jaas.config's IAMLoginModule (AWS MSK IAM) has no librdkafka twin: "
                          "give kafka.sasl.mechanism=OAUTHBEARER and a token callback from the Python API "
                          "(kafka_token_callback, as aws-msk-iam-sasl-signer-python makes tokens)")
    raise OptionError(f"kafka.sasl.jaas.config's login module {module} is not one segack can give "
                      f"librdkafka: use PlainLoginModule, ScramLoginModule, OAuthBearerLoginModule or "
                      f"Krb5LoginModule")


def _login_from_librdkafka(settings: Mapping[str, str]) -> Login | None:
    if "sasl.username" in settings or "sasl.password" in settings:
        if "sasl.username" not in settings or "sasl.password" not in settings:
            raise OptionError("kafka.sasl.username and kafka.sasl.password go together: give both")
        return Login("password", {"username": settings["sasl.username"],
                                  "password": settings["sasl.password"]})
    if settings.get("sasl.oauthbearer.method", "default").lower() == "oidc":
        missing = [name for name in ("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret")
                   if name not in settings]
        if missing:
            raise OptionError(f"kafka.sasl.oauthbearer.method=oidc needs kafka.{missing[0]}")
        return Login("oidc", {"client_id": settings["sasl.oauthbearer.client.id"],
                              "client_secret": settings["sasl.oauthbearer.client.secret"],
                              "scope": settings.get("sasl.oauthbearer.scope", "")})
    if settings.get("enable.sasl.oauthbearer.unsecure.jwt", "false").lower() == "true":
        config = dict(part.split("=", 1) for part in settings.get("sasl.oauthbearer.config", "").split()
                      if "=" in part)
        if "principal" not in config:
            raise OptionError("kafka.enable.sasl.oauthbearer.unsecure.jwt needs "
                              "kafka.sasl.oauthbearer.config=principal=NAME")
        extensions = ",".join(f"{name.removeprefix('extension_')}={value}" for name, value in config.items()
                              if name.startswith("extension_"))
        return Login("unsecured", {"principal": config["principal"], "extensions": extensions})
    if "sasl.kerberos.keytab" in settings or "sasl.kerberos.principal" in settings:
        return Login("kerberos", {"keytab": settings.get("sasl.kerberos.keytab", ""),
                                  "principal": settings.get("sasl.kerberos.principal", "")})
    return None


def _pem(path: str) -> bool | None:
    """Whether the file at ``path`` is PEM text; None where this process cannot read it."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return None
    return b"-----BEGIN " in head


def _jks(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"\xfe\xed\xfe\xed"
    except OSError:
        return False


def _trust(settings: Mapping[str, str]) -> tuple[str, str] | None:
    _one_of(settings, "ssl.truststore.location", "ssl.truststore.certificates", "ssl.ca.location",
            "ssl.ca.pem")
    if "ssl.ca.location" in settings:
        return ("file", settings["ssl.ca.location"])
    if "ssl.ca.pem" in settings:
        return ("pem", settings["ssl.ca.pem"])
    kind = settings.get("ssl.truststore.type", "").upper()
    if "ssl.truststore.certificates" in settings:
        if kind not in ("", "PEM"):
            raise OptionError("kafka.ssl.truststore.certificates is PEM text: give "
                              "kafka.ssl.truststore.type=PEM")
        return ("pem", settings["ssl.truststore.certificates"])
    location = settings.get("ssl.truststore.location")
    if location is None:
        return None
    if kind == "PEM" or (kind == "" and _pem(location)):
        return ("file", location)
    convert = ("keytool -exportcert -rfc -keystore STORE -alias ALIAS > ca.pem" if kind in ("", "JKS")
               else "openssl pkcs12 -in STORE -nokeys -out ca.pem")
    raise OptionError(f"kafka.ssl.truststore.location is a {kind or 'JKS'} trust store, which librdkafka "
                      f"cannot read: give the CA's certificates as PEM ({convert}), as "
                      f"kafka.ssl.truststore.location=ca.pem with kafka.ssl.truststore.type=PEM")


def _identity(settings: Mapping[str, str]) -> tuple[str, ...] | None:
    _one_of(settings, "ssl.keystore.location", "ssl.keystore.key", "ssl.certificate.location",
            "ssl.certificate.pem")
    _one_of(settings, "ssl.keystore.location", "ssl.keystore.certificate.chain", "ssl.key.location",
            "ssl.key.pem")
    if "ssl.certificate.pem" in settings or "ssl.key.pem" in settings:
        if "ssl.certificate.pem" not in settings or "ssl.key.pem" not in settings:
            raise OptionError("kafka.ssl.certificate.pem and kafka.ssl.key.pem go together: give both")
        return ("pem", settings["ssl.certificate.pem"], settings["ssl.key.pem"])
    if "ssl.keystore.key" in settings or "ssl.keystore.certificate.chain" in settings:
        if "ssl.keystore.key" not in settings or "ssl.keystore.certificate.chain" not in settings:
            raise OptionError("kafka.ssl.keystore.key and kafka.ssl.keystore.certificate.chain go together: "
                              "give both")
        return ("pem", settings["ssl.keystore.certificate.chain"], settings["ssl.keystore.key"])
    if "ssl.certificate.location" in settings or "ssl.key.location" in settings:
        if "ssl.certificate.location" not in settings or "ssl.key.location" not in settings:
            raise OptionError("kafka.ssl.certificate.location and kafka.ssl.key.location go together: "
                              "give both")
        certificate, key = settings["ssl.certificate.location"], settings["ssl.key.location"]
        return ("pem-file", key) if certificate == key else ("pem-files", certificate, key)
    location = settings.get("ssl.keystore.location")
    if location is None:
        return None
    kind = settings.get("ssl.keystore.type", "").upper()
    if kind == "PEM" or (kind == "" and _pem(location)):
        return ("pem-file", location)
    if kind == "PKCS12" or (kind == "" and not _jks(location)):
        return ("pkcs12", location)
    raise OptionError("kafka.ssl.keystore.location is a JKS key store, which librdkafka cannot read: "
                      "convert it (keytool -importkeystore -srckeystore STORE -destkeystore store.p12 "
                      "-deststoretype PKCS12) and give kafka.ssl.keystore.type=PKCS12")


def _check_host(settings: Mapping[str, str]) -> bool | None:
    value = settings.get("ssl.endpoint.identification.algorithm")
    if value is None:
        return None
    if value.strip().lower() in ("", "none"):
        return False
    if value.strip().lower() == "https":
        return True
    raise OptionError(f"kafka.ssl.endpoint.identification.algorithm is https (check the broker's host name) "
                      f"or empty (do not), not {value!r}")


def read_security(settings: Mapping[str, str]) -> Security:
    """The security ``settings`` say, in either client's spelling (step 1).

    Parameters
    ----------
    settings : mapping
        A Kafka client's settings, without the ``kafka.`` prefix.

    Raises
    ------
    OptionError
        A thing said in both spellings, a JAAS line that is not one or names a login module
        librdkafka has no twin of, a JKS store, half of a pair (``sasl.username`` without
        ``sasl.password``), an endpoint identification other than ``https`` or none.
    """
    _one_of(settings, "sasl.jaas.config", "sasl.username")
    _one_of(settings, "sasl.jaas.config", "sasl.oauthbearer.client.id")
    _one_of(settings, "sasl.jaas.config", "sasl.oauthbearer.config")
    _one_of(settings, "sasl.jaas.config", "sasl.kerberos.keytab")
    login = (_login_from_jaas(settings["sasl.jaas.config"], settings) if "sasl.jaas.config" in settings
             else _login_from_librdkafka(settings))
    identity = _identity(settings)
    pkcs12 = identity is not None and identity[0] == "pkcs12"
    return Security(login=login, trust=_trust(settings), identity=identity,
                    store_password=settings.get("ssl.keystore.password") if pkcs12 else None,
                    key_password=settings.get("ssl.key.password"), check_host=_check_host(settings),
                    token_endpoint=settings.get("sasl.oauthbearer.token.endpoint.url"))


def _others(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings :class:`Security` does not read: alike in both clients, or one's own."""
    return {name: value for name, value in settings.items()
            if name not in _LIBRDKAFKA_NAMES | _JAVA_NAMES | _SHARED_NAMES}


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` (either spelling, no ``kafka.`` prefix) as Kafka's Java client takes them (step 2).

    Raises
    ------
    OptionError
        As :func:`read_security`, and for what the Java client cannot take: a client certificate and
        its key in two PEM files (give one file with both, as ``ssl.keystore.location`` with
        ``ssl.keystore.type=PEM``).
    """
    security = read_security(settings)
    written = _others(settings)
    if "sasl.mechanisms" in written:  # librdkafka's other name for it
        written["sasl.mechanism"] = written.pop("sasl.mechanisms")
    mechanism = written.get("sasl.mechanism", "").upper()
    login = security.login
    if login is not None and login.kind == "password":
        if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise OptionError("a SASL user and password log in with PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512: "
                              "give kafka.sasl.mechanism")
        module = _PLAIN if mechanism == "PLAIN" else _SCRAM
        written["sasl.jaas.config"] = (f"{module} required username={_quoted(login.values['username'])} "
                                       f"password={_quoted(login.values['password'])};")
    elif login is not None and login.kind == "unsecured":
        pairs = [pair.split("=", 1) for pair in login.values["extensions"].split(",") if pair]
        extensions = "".join(f" unsecuredLoginExtension_{name}={_quoted(value)}" for name, value in pairs)
        written["sasl.jaas.config"] = (f"{_OAUTH} required unsecuredLoginStringClaim_sub="
                                       f"{_quoted(login.values['principal'])}{extensions};")
    elif login is not None and login.kind == "oidc":
        scope = f" scope={_quoted(login.values['scope'])}" if login.values["scope"] else ""
        written["sasl.jaas.config"] = (f"{_OAUTH} required clientId={_quoted(login.values['client_id'])} "
                                       f"clientSecret={_quoted(login.values['client_secret'])}{scope};")
        written["sasl.login.callback.handler.class"] = settings.get("sasl.login.callback.handler.class",
                                                                    _OAUTH_HANDLER)
    elif login is not None and login.kind == "kerberos":
        written["sasl.jaas.config"] = (f"{_KERBEROS} required useKeyTab=true storeKey=true "
                                       f"keyTab={_quoted(login.values['keytab'])} "
                                       f"principal={_quoted(login.values['principal'])};")
    if "sasl.jaas.config" in settings:  # the user's own line, as written: the Java client reads it
        written["sasl.jaas.config"] = settings["sasl.jaas.config"]
        if "sasl.login.callback.handler.class" in settings:
            written["sasl.login.callback.handler.class"] = settings["sasl.login.callback.handler.class"]
    if security.token_endpoint is not None:
        written["sasl.oauthbearer.token.endpoint.url"] = security.token_endpoint
    if security.trust is not None:
        written["ssl.truststore.type"] = "PEM"
        written["ssl.truststore.location" if security.trust[0] == "file"
                else "ssl.truststore.certificates"] = security.trust[1]
    identity = security.identity
    if identity is not None:
        if identity[0] == "pem-files":
            raise OptionError("kafka.ssl.certificate.location and kafka.ssl.key.location are two files, "
                              "which Kafka's Java client cannot take: put the key and its certificates in "
                              "one PEM file, given as kafka.ssl.keystore.location with "
                              "kafka.ssl.keystore.type=PEM")
        written["ssl.keystore.type"] = "PKCS12" if identity[0] == "pkcs12" else "PEM"
        if identity[0] == "pem":
            written["ssl.keystore.certificate.chain"], written["ssl.keystore.key"] = identity[1], identity[2]
        else:
            written["ssl.keystore.location"] = identity[1]
        if security.store_password is not None:
            written["ssl.keystore.password"] = security.store_password
    if security.key_password is not None:
        written["ssl.key.password"] = security.key_password
    if security.check_host is not None:
        written["ssl.endpoint.identification.algorithm"] = "https" if security.check_host else ""
    return written


def librdkafka_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` (either spelling, no ``kafka.`` prefix) as librdkafka takes them (step 2).

    Raises
    ------
    OptionError
        As :func:`read_security`: a JKS store, an AWS MSK IAM login module, and the rest it names.
    """
    security = read_security(settings)
    written = _others(settings)
    login = security.login
    if login is not None and login.kind == "password":
        written["sasl.username"] = login.values["username"]
        written["sasl.password"] = login.values["password"]
    elif login is not None and login.kind == "unsecured":
        extensions = "".join(f" extension_{pair}" for pair in login.values["extensions"].split(",") if pair)
        written["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
        written["sasl.oauthbearer.config"] = f"principal={login.values['principal']}{extensions}"
    elif login is not None and login.kind == "oidc":
        written["sasl.oauthbearer.method"] = "oidc"
        written["sasl.oauthbearer.client.id"] = login.values["client_id"]
        written["sasl.oauthbearer.client.secret"] = login.values["client_secret"]
        if login.values["scope"]:
            written["sasl.oauthbearer.scope"] = login.values["scope"]
    elif login is not None and login.kind == "kerberos":
        written["sasl.kerberos.keytab"] = login.values["keytab"]
        written["sasl.kerberos.principal"] = login.values["principal"]
    if security.token_endpoint is not None:
        written["sasl.oauthbearer.token.endpoint.url"] = security.token_endpoint
    if security.trust is not None:
        written["ssl.ca.location" if security.trust[0] == "file" else "ssl.ca.pem"] = security.trust[1]
    identity = security.identity
    if identity is not None:
        if identity[0] == "pkcs12":
            written["ssl.keystore.location"] = identity[1]
            if security.store_password is not None:
                written["ssl.keystore.password"] = security.store_password
        elif identity[0] == "pem-file":
            written["ssl.certificate.location"] = written["ssl.key.location"] = identity[1]
        elif identity[0] == "pem-files":
            written["ssl.certificate.location"], written["ssl.key.location"] = identity[1], identity[2]
        else:
            written["ssl.certificate.pem"], written["ssl.key.pem"] = identity[1], identity[2]
    if security.key_password is not None:
        written["ssl.key.password"] = security.key_password
    if security.check_host is not None:
        written["ssl.endpoint.identification.algorithm"] = "https" if security.check_host else "none"
    return written



def _prefixed(options: Mapping[str, str]) -> dict[str, str]:
    return {name.removeprefix("kafka."): value for name, value in options.items()
            if name.startswith("kafka.")}


def java_options(options: Mapping[str, str]) -> dict[str, str]:
    """Reader ``options`` (Spark's Kafka source's, ``kafka.*`` among them) with the ``kafka.*`` ones
    in the Java client's spelling (:func:`java_settings`); the others as given."""
    others = {name: value for name, value in options.items() if not name.startswith("kafka.")}
    return {**others, **{f"kafka.{name}": value for name, value in java_settings(_prefixed(options)).items()}}


def librdkafka_client(options: Mapping[str, str]) -> dict[str, str]:
    """librdkafka's settings (no prefix) from the ``kafka.*`` ones of reader ``options``
    (:func:`librdkafka_settings`)."""
    return librdkafka_settings(_prefixed(options))


#: What a client's error text says when the broker's certificate is not trusted (librdkafka's
#: OpenSSL, Java's PKIX), or does not name the address the client asked.
_UNTRUSTED = ("certificate verify failed", "pkix path building failed",
              "unable to find valid certification path")
_MISNAMED = ("no subject alternative", "hostname mismatch", "does not match the certificate")


def security_failure(text: str) -> str | None:
    """What a Kafka client's error ``text`` says went wrong in its TLS handshake or its login, in
    one sentence that names the settings to look at; ``None`` for any other error."""
    lowered = text.lower()
    if any(words in lowered for words in _UNTRUSTED):
        return ("the broker's certificate is not signed by a CA the client trusts: give the CA that "
                "signed it as kafka.ssl.truststore.location (or kafka.ssl.ca.location)")
    if any(words in lowered for words in _MISNAMED):
        return ("the broker's certificate does not name the address the client reached it at: "
                "give the address it names in kafka.bootstrap.servers")
    for line in text.splitlines():
        found = line.lower().find("authentication failed")
        if found >= 0:  # librdkafka's and the Java client's words alike; not librdkafka's suffix
            return re.sub(r"\s*\(after \d+ms in state \w+\)$", "", line[found:].strip()).replace(
                "Authentication failed", "authentication failed", 1)
    return None


class ClientLog:
    """A librdkafka client's log (its ``logger`` setting), as segack's at DEBUG: a client repeats
    its errors on every try, and what they come to is said once, by segack, where it acts on them."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def log(self, level: int, message: str, *args: object) -> None:
        self._log.debug(message, *args)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (ClientLog, (self._log.name,))
