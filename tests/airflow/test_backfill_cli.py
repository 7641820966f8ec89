from __future__ import annotations

import json

import pytest

from primus_lib.cli.main import main
from tests.fixtures.specs import airflow_doc, write_spec


def _spec(tmp_path):
    return str(write_spec(tmp_path / "bf.yaml", airflow_doc("bf")))


def test_dry_run_lists_the_windows_in_order_and_the_airflow_request(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    assert (
        main(
            [
                "backfill",
                _spec(tmp_path),
                "--from",
                "2026-11-01T01:00Z",
                "--to",
                "2026-11-01T09:00Z",
                "--dry-run",
                "--mode",
                "skip",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in out if line.strip().startswith("window")] == [
        "2026-11-01T01:00:00Z",
        "2026-11-01T02:00:00Z",
        "2026-11-01T03:00:00Z",
    ]  # the timer ends at 04:00
    request = json.loads(out[-1].removeprefix("request: "))
    assert request["from_date"] == "2026-11-01T01:00:00Z" and request["to_date"] == "2026-11-01T03:00:00Z"
    assert request["reprocess_behavior"] == "failed" and request["dag_run_conf"] == {"mode": "skip"}


def test_bad_ranges_are_refused_with_the_flag_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    spec = _spec(tmp_path)
    assert main(["backfill", spec, "--from", "yesterday", "--to", "2026-11-01T02:00Z", "--dry-run"]) == 2
    assert "--from: expected an ISO instant" in capsys.readouterr().err
    assert main(["backfill", spec, "--from", "2026-11-01T02:00Z", "--to", "2026-11-01T01:00Z", "--dry-run"]) == 2
    assert "must be after --from" in capsys.readouterr().err
    assert main(["backfill", spec, "--from", "2026-12-01T00:00Z", "--to", "2026-12-02T00:00Z", "--dry-run"]) == 2
    assert "no window of job bf" in capsys.readouterr().err


def test_a_password_in_argv_is_refused_with_the_ways_to_pass_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    spec = _spec(tmp_path)
    for flag in (["--password", "hunter2"], ["--password=hunter2"], ["--password"]):
        with pytest.raises(SystemExit) as refused:
            main(["backfill", spec, "--from", "2026-11-01T01:00Z", "--to", "2026-11-01T02:00Z", "--api", "x", *flag])
        assert refused.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("primus backfill: --password is refused"), err
        assert "--password-file" in err[0] and "$PRIMUS_SECRETS_DIR" in err[0] and "hunter2" not in err[0]


def _credentials(argv: list[str], connections: dict[str, dict], secrets):
    from primus_lib.cli.backfill import credentials
    from primus_lib.cli.main import build_parser
    from primus_lib.credentials import Resolver, SecretFiles

    secrets.mkdir(exist_ok=True)
    for path in secrets.iterdir():
        path.unlink()
    for conn_id, body in connections.items():
        (secrets / f"{conn_id}.json").write_text(body if isinstance(body, str) else json.dumps(body))
    args = build_parser().parse_args(["backfill", "s.yaml", "--from", "a", "--to", "b", *argv])
    return credentials(args, Resolver(SecretFiles(secrets)))


def test_the_password_comes_from_the_file_then_the_mounted_connection(tmp_path, monkeypatch):
    secret = tmp_path / "airflow-password"
    secret.write_text("from-file\n")
    secrets = tmp_path / "secrets"
    api = {"primus_airflow_api": {"conn_type": "http", "login": "ops", "password": "c"}}
    other = {"other": {"conn_type": "http", "host": "127.0.0.1", "login": "bob", "password": "p@ss"}}
    monkeypatch.setenv("PRIMUS_AIRFLOW_PASSWORD", "from-env")  # no longer read: a secret is a file
    monkeypatch.setenv("PRIMUS_AIRFLOW_USER", "env-user")
    assert _credentials(["--password-file", str(secret)], api, secrets) == ("ops", "from-file")
    assert _credentials([], api, secrets) == ("ops", "c")
    assert _credentials(["--conn-id", "other", "--user", "amy"], other, secrets) == ("amy", "p@ss")
    assert _credentials([], {}, secrets) == ("admin", None)  # no password: no token asked for


def test_an_unusable_password_file_or_connection_is_one_line_naming_it(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\nsecond line\n")
    cases = {
        ("--password-file", str(tmp_path / "missing")): "missing: cannot read it: No such file or directory",
        ("--password-file", str(empty)): "empty: its first line is empty",
    }
    secrets = tmp_path / "secrets"
    for argv, expected in cases.items():
        with pytest.raises(ValueError, match=expected):
            _credentials(list(argv), {}, secrets)
    with pytest.raises(ValueError, match=r"primus_airflow_api.json: expected a JSON connection object, not valid"):
        _credentials([], {"primus_airflow_api": '{"password": "x"'}, secrets)


def test_an_api_that_is_no_url_or_does_not_answer_is_one_line(tmp_path, monkeypatch, capsys):
    from tests.fixtures._proc import free_port

    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    window = ["--from", "2026-11-01T01:00Z", "--to", "2026-11-01T03:00Z"]
    assert main(["backfill", _spec(tmp_path), *window, "--api", "airflow:8080"]) == 2
    assert capsys.readouterr().err.strip() == (
        "primus backfill: --api: expected an http(s) URL like http://host:8080, got 'airflow:8080'"
    )
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["backfill", _spec(tmp_path), *window, "--api", url, "--user", "u"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"primus backfill: Airflow API {url}: ") and "refused" in err[0]
