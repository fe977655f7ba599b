"""A cluster's settings in either client's spelling, written for each (no Spark, no broker: the
secured broker's tests in ``tests/test_kafka_secured.py`` show that each client logs in with them)."""

from __future__ import annotations

import pytest

from segack.spark_adapter import OptionError
from segack.spark_adapter.sources.kafka_settings import (
    REDACTED,
    java_settings,
    librdkafka_settings,
    redacted,
)

SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
              'password="s3cr\\"et;x";')
BASE = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL"}


@pytest.fixture
def pem(tmp_path):
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return str(path)


def test_a_scram_jaas_line_and_a_pem_trust_store_are_librdkafkas_username_password_and_ca(pem):
    given = {**BASE, "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": SCRAM_JAAS,
             "ssl.truststore.location": pem, "ssl.truststore.type": "PEM", "ssl.truststore.password": "x",
             "ssl.endpoint.identification.algorithm": "", "fetch.max.bytes": "1000"}
    assert librdkafka_settings(given) == {
        **BASE, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": 's3cr"et;x',
        "ssl.ca.location": pem, "ssl.endpoint.identification.algorithm": "none", "fetch.max.bytes": "1000"}
    # The Java client is given the line as written.
    assert java_settings(given)["sasl.jaas.config"] == SCRAM_JAAS


def test_librdkafkas_names_are_the_java_clients_for_spark(pem):
    given = {**BASE, "sasl.mechanisms": "PLAIN", "sasl.username": "bob", "sasl.password": 'p"w\\',
             "ssl.ca.location": pem, "ssl.endpoint.identification.algorithm": "none"}
    assert java_settings(given) == {
        **BASE, "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                             'username="bob" password="p\\"w\\\\";'),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pem,
        "ssl.endpoint.identification.algorithm": ""}
    # Read back, the line says what was given.
    assert librdkafka_settings(java_settings(given)) == {
        **BASE, "sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": 'p"w\\',
        "ssl.ca.location": pem, "ssl.endpoint.identification.algorithm": "none"}


def test_pem_text_and_client_certificates_in_each_form():
    text = {"ssl.truststore.certificates": "CA", "ssl.truststore.type": "PEM",
            "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "CHAIN", "ssl.keystore.key": "KEY",
            "ssl.key.password": "kp"}
    assert librdkafka_settings(text) == {"ssl.ca.pem": "CA", "ssl.certificate.pem": "CHAIN",
                                         "ssl.key.pem": "KEY", "ssl.key.password": "kp"}
    assert java_settings({"ssl.ca.pem": "CA", "ssl.certificate.pem": "CHAIN", "ssl.key.pem": "KEY"}) == {
        "ssl.truststore.type": "PEM", "ssl.truststore.certificates": "CA", "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "CHAIN", "ssl.keystore.key": "KEY"}
    assert librdkafka_settings({"ssl.keystore.location": "/k.pem", "ssl.keystore.type": "PEM"}) == {
        "ssl.certificate.location": "/k.pem", "ssl.key.location": "/k.pem"}
    assert librdkafka_settings({"ssl.keystore.location": "/k.p12", "ssl.keystore.type": "PKCS12",
                                "ssl.keystore.password": "sp"}) == {
        "ssl.keystore.location": "/k.p12", "ssl.keystore.password": "sp"}
    assert java_settings({"ssl.certificate.location": "/k.pem", "ssl.key.location": "/k.pem"}) == {
        "ssl.keystore.type": "PEM", "ssl.keystore.location": "/k.pem"}


def test_oauth_logins_unsigned_and_oidc():
    unsigned = ('org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                'unsecuredLoginStringClaim_sub="svc" unsecuredLoginExtension_traceId="7";')
    assert librdkafka_settings({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": unsigned}) == {
        "sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": "principal=svc extension_traceId=7"}
    oidc = {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "app", "sasl.oauthbearer.client.secret": "cs",
            "sasl.oauthbearer.scope": "kafka", "sasl.oauthbearer.token.endpoint.url": "https://idp/token"}
    assert java_settings(oidc) == {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": ('org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                             'clientId="app" clientSecret="cs" scope="kafka";'),
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token"}
    assert librdkafka_settings(java_settings(oidc)) == oidc


@pytest.mark.parametrize("given, said", [
    ({"sasl.jaas.config": SCRAM_JAAS, "sasl.username": "a", "sasl.mechanism": "SCRAM-SHA-512"},
     "kafka.sasl.jaas.config and kafka.sasl.username say the same thing twice"),
    ({"sasl.jaas.config": "PlainLoginModule username=a", "sasl.mechanism": "PLAIN"}, "is not a JAAS line"),
    ({"sasl.jaas.config": SCRAM_JAAS, "sasl.mechanism": "PLAIN"}, "give kafka.sasl.mechanism=SCRAM-SHA-512"),
    ({"sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
      "sasl.mechanism": "AWS_MSK_IAM"}, "IAMLoginModule (AWS MSK IAM) has no librdkafka twin"),
    ({"sasl.jaas.config": "org.example.Custom required;"}, "login module org.example.Custom is not one"),
    ({"sasl.username": "a"}, "kafka.sasl.username and kafka.sasl.password go together"),
    ({"ssl.truststore.location": "/nowhere/store.jks"}, "is a JKS trust store, which librdkafka cannot read"),
    ({"ssl.truststore.location": "/t.p12", "ssl.truststore.type": "PKCS12"}, "openssl pkcs12 -in STORE"),
    ({"ssl.ca.location": "/a", "ssl.truststore.location": "/b"}, "say the same thing twice"),
    ({"ssl.endpoint.identification.algorithm": "http"}, "is https (check the broker's host name) or empty"),
])
def test_what_librdkafka_cannot_take_is_refused_in_one_line_naming_it(given, said):
    with pytest.raises(OptionError) as raised:
        librdkafka_settings(given)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_jks_key_store_is_refused_saying_how_to_convert_it(tmp_path):
    store = tmp_path / "client.jks"
    store.write_bytes(b"\xfe\xed\xfe\xed" + b"\0" * 60)
    with pytest.raises(OptionError, match="keytool -importkeystore"):
        librdkafka_settings({"ssl.keystore.location": str(store), "ssl.keystore.password": "x"})
    # A PKCS12 store (not JKS, not PEM) is librdkafka's own.
    store.write_bytes(b"\x30\x82" + b"\0" * 60)
    assert librdkafka_settings({"ssl.keystore.location": str(store), "ssl.keystore.password": "x"}) == {
        "ssl.keystore.location": str(store), "ssl.keystore.password": "x"}


def test_two_pem_files_for_a_client_certificate_are_refused_for_the_java_client_only():
    given = {"ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"}
    assert librdkafka_settings(given) == given
    with pytest.raises(OptionError, match="put the key and its certificates in one PEM file"):
        java_settings(given)


def test_secrets_are_redacted_in_either_spelling():
    shown = redacted({"kafka.sasl.jaas.config": SCRAM_JAAS, "sasl.password": "p", "ssl.key.pem": "K",
                      "ssl.keystore.key": "K", "sasl.oauthbearer.client.secret": "c", "ssl.key.password": "k",
                      "ssl.truststore.password": "t", "basic.auth.user.info": "u:p",
                      "kafka.bootstrap.servers": "b:1", "sasl.username": "alice", "ssl.key.location": "/k"})
    assert shown == {"kafka.sasl.jaas.config": REDACTED, "sasl.password": REDACTED, "ssl.key.pem": REDACTED,
                     "ssl.keystore.key": REDACTED, "sasl.oauthbearer.client.secret": REDACTED,
                     "ssl.key.password": REDACTED, "ssl.truststore.password": REDACTED,
                     "basic.auth.user.info": REDACTED, "kafka.bootstrap.servers": "b:1",
                     "sasl.username": "alice", "ssl.key.location": "/k"}


@pytest.mark.parametrize(("mode", "options", "said"), [
    ("real-time", ["subscribePattern=accounts-(eu"], "subscribePattern 'accounts-(eu' is not a regular "
     "expression"),
    ("real-time", ["subscribe=a", "kafka.ssl.truststore.location=/etc/kafka/store.jks"],
     "is a JKS trust store, which librdkafka cannot read"),
    ("available-now", ["subscribe=a", "kafka.sasl.username=alice", "kafka.sasl.password=p"],
     "give kafka.sasl.mechanism"),
])
def test_the_commands_kafka_options_are_refused_before_spark_starts(tmp_path, capsys, monkeypatch, mode,
                                                                    options, said):
    from segack.cli import ExitCode, main, runs

    def no_spark(*_: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(runs, "start_session", no_spark)
    command = ["stream", "--format", "kafka", "--option", "kafka.bootstrap.servers=127.0.0.1:9",
               *[part for option in options for part in ("--option", option)],
               "--value-schema", "user STRING", "--key", "key", "--order", "offset",
               "--handler", "tests.spark_handlers:record_kafka",
               "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", mode]
    assert main(command) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "checkpoint").exists()


def test_a_properties_file_is_read_as_java_reads_one():
    from segack.cli.properties import read_properties

    text = ("# a comment\n! another\n\n  bootstrap.servers = b:9093\nsecurity.protocol:SASL_SSL\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
            "    username=\"u\" password=\"p\\\\q=r\";\nkey\\ with\\=odd\\:chars value\\tand\\u00e9\n"
            "empty=\nlast=ends in a backslash \\\\\n")
    assert read_properties(text) == [
        ("bootstrap.servers", "b:9093"), ("security.protocol", "SASL_SSL"),
        ("sasl.jaas.config", 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                             'username="u" password="p\\q=r";'),
        ("key with=odd:chars", "value\tand\u00e9"), ("empty", ""), ("last", "ends in a backslash \\")]
    with pytest.raises(ValueError, match="four hexadecimal digits"):
        read_properties("a=\\u12")


def test_a_kafka_properties_file_is_the_commands_kafka_options_an_option_beside_it_winning(tmp_path):
    from segack.cli.parser import build_parser, check_input

    properties = tmp_path / "client.properties"
    properties.write_text("bootstrap.servers=a:1\nsasl.mechanism=PLAIN\n")
    parser = build_parser()
    args = parser.parse_args(["stream", "--format", "kafka", "--kafka-properties", str(properties),
                              "--option", "kafka.bootstrap.servers=b:2", "--option", "subscribe=t",
                              "--value-schema", "user STRING", "--key", "key", "--order", "offset",
                              "--handler", "m:h", "--checkpoint", str(tmp_path / "c")])
    check_input(parser, args)
    assert dict(args.option) == {"kafka.bootstrap.servers": "b:2", "kafka.sasl.mechanism": "PLAIN",
                                 "subscribe": "t"}


def test_a_kafka_properties_file_it_cannot_read_is_a_usage_error_naming_it(tmp_path, capsys):
    from segack.cli import ExitCode, main

    missing = tmp_path / "nowhere.properties"
    command = ["stream", "--format", "kafka", "--kafka-properties", str(missing), "--option", "subscribe=t",
               "--value-schema", "user STRING", "--key", "key", "--order", "offset",
               "--handler", "tests.spark_handlers:record_kafka", "--checkpoint", str(tmp_path / "c")]
    with pytest.raises(SystemExit) as exited:
        main(command)
    assert exited.value.code == ExitCode.USAGE
    assert capsys.readouterr().err == (f"segack stream: error: --kafka-properties: cannot read {missing}: "
                                       f"No such file or directory\n")
    assert not (tmp_path / "c").exists()
