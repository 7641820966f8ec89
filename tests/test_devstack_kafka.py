"""devstack/kafka.py's login rules, without a broker (tests/data/test_kafka_login.py runs one)."""

from __future__ import annotations

import pytest

from devstack.kafka import KafkaServer, Login, LoginMismatch, main, server_properties


def test_a_login_that_would_need_escaping_is_refused_and_never_printed():
    for user, password in (("admin", 'pa"ss'), ("admin", "pa ss"), ("ad,min", "pw"), ("admin", ""), ("a=b", "pw")):
        with pytest.raises(ValueError, match="expected a non-empty value"):
            Login(user, password)
    assert "s3cret" not in repr(Login("admin", "s3cret"))


def test_every_listener_asks_for_the_login(tmp_path):
    text = server_properties(tmp_path / "data", 9092, 9093, Login("admin", "pw-1"))
    settings = dict(line.split("=", 1) for line in text.splitlines())
    assert settings["listener.security.protocol.map"] == "CLIENT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    assert settings["listener.name.client.sasl.enabled.mechanisms"] == "SCRAM-SHA-256"
    assert settings["listener.name.controller.sasl.enabled.mechanisms"] == "PLAIN"
    assert "PLAINTEXT://" not in settings["listeners"]


def test_a_data_dir_formatted_for_another_login_is_refused_naming_what_to_remove(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("node.id=1\n")  # formatted before brokers asked for a login
    with pytest.raises(LoginMismatch, match=rf"{data} was formatted for a broker without a login: remove it"):
        KafkaServer(tmp_path, "unused", Login("admin", "pw-1"))
    (tmp_path / "login.sha256").write_text(Login("admin", "pw-1").fingerprint() + "\n")
    with pytest.raises(LoginMismatch, match="formatted for another login"):
        KafkaServer(tmp_path, "unused", Login("admin", "pw-2"))
    assert not (tmp_path / "server.properties").exists()  # refused before anything was written


def test_the_launcher_takes_the_password_from_the_environment_only(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PRIMUS_KAFKA_PASSWORD", raising=False)
    assert main(["run", "--port", "1", "--controller-port", "2", "--dir", str(tmp_path)]) == 2
    assert "set $PRIMUS_KAFKA_PASSWORD" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no flag carries it (a command line is visible to every user)
        main(["run", "--port", "1", "--controller-port", "2", "--dir", str(tmp_path), "--password", "x"])
