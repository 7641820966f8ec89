"""Hostile specs: ``${VAR}`` values that try to leave their roots or smuggle a newline, YAML that
tries to run code or explode, files that are not text, and the CLI's answer to each.

The field-by-field corpus (wrong types, unknown fields, hostile sizes, escaping paths) is
tests/spec/invalid/ (tests/spec/test_invalid_corpus.py); here: what needs an environment, a
file that is not YAML, or a whole command. Every answer is one line per problem, naming the
file and field, exit 2, no traceback.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from primus_lib.spec import SpecError, load_job
from tests.fixtures.specs import demo_doc, write_spec

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "spec" / "invalid"
HOSTILE_CORPUS = [  # the corpus entries this suite added (docs/reliability.md)
    "uri-dotdot",
    "uri-control-character",
    "s3-uri-without-bucket",
    "file-pattern-escapes",
    "success-marker-escapes",
    "storage-root-dotdot",
    "role-name-path",
    "replicas-huge",
    "gpu-huge",
    "buckets-huge",
    "embedding-dim-huge",
    "batch-size-huge",
    "lag-overflow",
    "scaling-interval-zero",
    "checkpoint-interval-zero",
    "learning-rate-infinite",
    "priority-nan",
    "sparse-not-a-list",
    "spec-a-list",
]


def _doc() -> dict:
    return demo_doc("file:///srv/ctr", hours=2, rows_per_shard=100)


def _source(doc: dict) -> dict:
    return doc["spec"]["dataset"]["streams"][0]["sources"][0]


def _write(tmp_path: Path, doc: dict, name: str = "job.yaml") -> Path:
    return write_spec(tmp_path / name, doc)


# (case, where ${VAR} goes, its value, the field path, what the line must say)
ENV_CASES = [
    (
        "var-climbs-out-of-root",
        ("uri", "file://${DATA}/impressions/{YYYY}{MM}{DD}/{HH}/"),
        "/srv/ctr/../../etc",
        "spec.dataset.streams[0].sources[0].uri",
        "expected a URI without '..' segments",
    ),
    (
        "var-switches-scheme",
        ("uri", "${DATA}/impressions/{YYYY}{MM}{DD}/{HH}/"),
        "ftp://evil.example",
        "spec.dataset.streams[0].sources[0].uri",
        "expected a URI with scheme file://",
    ),
    (
        "var-with-newline-in-uri",
        ("uri", "file://${DATA}/impressions/{YYYY}/"),
        "/srv/ctr\nX-Injected: 1",
        "spec.dataset.streams[0].sources[0].uri",
        "expected environment variable DATA without control characters",
    ),
    (
        "var-with-newline-in-name",
        ("name", "${DATA}"),
        "ctr\nevil",
        "metadata.name",
        "expected environment variable DATA without control characters, found '\\n' at character 3",
    ),
    (
        "var-with-newline-in-topic",
        ("topic", "${DATA}"),
        "ctr-events\n",
        "spec.dataset.streams[1].sources[0].kafka.topic",
        "expected environment variable DATA without control characters",
    ),
    (
        "var-with-nul-in-root",
        ("root", "${DATA}"),
        "/var/lib/primus\x00/etc",
        "spec.storage.root",
        "expected environment variable DATA without control characters",
    ),
    (
        "var-makes-topic-a-path",
        ("topic", "${DATA}"),
        "../../ctr-events",
        "spec.dataset.streams[1].sources[0].kafka.topic",
        "expected a Kafka topic name of [A-Za-z0-9._-]",
    ),
    (
        "var-escapes-success-marker",
        ("marker", "${DATA}"),
        "../../../etc/passwd",
        "spec.dataset.streams[0].sources[0].success_marker",
        "expected a file name inside the partition directory",
    ),
]


def _place(doc: dict, where: str, template: str) -> None:
    if where == "uri":
        _source(doc)["uri"] = template
    elif where == "name":
        doc["metadata"]["name"] = template
    elif where == "topic":
        doc["spec"]["dataset"]["streams"][1]["sources"][0]["kafka"]["topic"] = template
    elif where == "root":
        doc["spec"]["storage"] = {"root": template}
    elif where == "marker":
        _source(doc)["success_marker"] = template


@pytest.mark.parametrize(("place", "value", "path", "says"), [c[1:] for c in ENV_CASES], ids=[c[0] for c in ENV_CASES])
def test_hostile_variable_values_are_refused_at_the_field(tmp_path, place, value, path, says):
    doc = _doc()
    _place(doc, *place)
    spec = _write(tmp_path, doc)
    for warnings in (None, []):  # also when unset variables are only warnings (`primus validate`)
        with pytest.raises(SpecError) as caught:
            load_job(spec, env={"DATA": value}, warnings=warnings)
        lines = str(caught.value).splitlines()
        assert any(line.startswith(f"{spec}: {path}: {says}") for line in lines), lines


def test_a_variable_is_expanded_once_not_again(tmp_path):
    """A value that itself looks like ${SECRET} stays literal: no second expansion leaks SECRET."""
    doc = _doc()
    doc["metadata"]["annotations"] = {"team": "${TEAM}"}  # free text (labels have Kubernetes' shape)
    job = load_job(_write(tmp_path, doc), env={"TEAM": "${SECRET}", "SECRET": "hunter2"})
    assert job.metadata.annotations == {"team": "${SECRET}"}


def test_a_password_with_a_newline_is_refused_without_showing_it(tmp_path):
    doc = _doc()
    doc["spec"]["storage"] = {"database": "postgresql+psycopg2://primus:${DB_PASSWORD}@db:5432/primus"}
    with pytest.raises(SpecError) as caught:
        load_job(_write(tmp_path, doc), env={"DB_PASSWORD": "s3cr3t-pw\n"})
    assert "spec.storage.database: expected environment variable DB_PASSWORD without control characters" in str(
        caught.value
    )
    assert "s3cr3t" not in str(caught.value)


# Values a field must never carry on to a pod, a command line, a path or another system's name.
HOSTILE = {
    "subst": "$(id)",
    "semicolon": "x;rm -rf /",
    "dotdot": "../../etc",
    "newline": "ok\nX-Injected: 1",
    "trailing-newline": "ok\n",
    "backquote": "`id`",
    "space": "a b",
    "nul": "a\x00b",
}
NAMES = set(HOSTILE)  # refused in every shape
PATHS = {"dotdot", "newline", "trailing-newline", "nul"}  # paths and URIs: literal otherwise (never a shell)
FREE_TEXT = {"newline", "trailing-newline", "nul"}  # kubeconfig path, context: control characters only


def _cluster(doc: dict, **field) -> dict:
    cluster = {"name": "c1", "backend": "yarn", "resource_manager": "http://rm:8088", **field}
    doc["spec"]["resources"]["clusters"] = [cluster]
    return doc


def _set(path: str, value: str):
    """A doc with ``value`` at ``path`` (dots and [i] as in the problem lines; '<key>': a mapping key)."""

    def place(doc: dict) -> None:
        parts = path.replace("[", ".").replace("]", "").split(".")
        node = doc
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        last = parts[-1]
        if last == "<key>":
            node[value] = {"replicas": 1} if path.startswith("spec.resources.roles") else "x"
        else:
            node[int(last) if last.isdigit() else last] = value

    return place


SOURCE = "spec.dataset.streams[0].sources[0]"
# (where the value goes, the problem's path ('<key>': the value itself), what it says, refused values)
FIELD_CASES = [
    ("metadata.name", "metadata.name", "expected a string matching", NAMES),
    ("metadata.namespace", "metadata.namespace", "expected a Kubernetes namespace", NAMES),
    ("metadata.labels.team", "metadata.labels.team", "expected a label value", NAMES),
    ("metadata.labels.<key>", "metadata.labels.<key>", "expected a label key", NAMES),
    ("metadata.annotations.<key>", "metadata.annotations.<key>", "expected an annotation key", NAMES),
    ("spec.resources.namespace", "spec.resources.namespace", "expected a Kubernetes namespace", NAMES),
    ("spec.resources.roles.<key>", "spec.resources.roles.<key>", "expected a role name", NAMES),
    ("spec.resources.roles.trainer.image", "spec.resources.roles.trainer.image", "expected a container image", NAMES),
    ("spec.resources.roles.trainer.command.1", "spec.resources.roles.trainer.command[1]", "expected an argument without NUL", {"nul"}),
    ("spec.resources.clusters.0.name", "spec.resources.clusters[0].name", "expected a cluster name", NAMES),
    ("spec.resources.clusters.0.namespace", "spec.resources.clusters[0].namespace", "expected a Kubernetes namespace", NAMES),
    ("spec.resources.clusters.0.queue", "spec.resources.clusters[0].queue", "expected a YARN queue name", NAMES),
    ("spec.resources.clusters.0.resource_manager", "spec.resources.clusters[0].resource_manager", "expected an http(s)://HOST:PORT URL", NAMES),
    ("spec.resources.clusters.0.context", "spec.resources.clusters[0].context", "expected a value without control", FREE_TEXT),
    ("spec.resources.clusters.0.kubeconfig", "spec.resources.clusters[0].kubeconfig", "expected a value without control", FREE_TEXT),
    ("spec.dataset.streams.0.name", "spec.dataset.streams[0].name", "expected a string matching", NAMES),
    (f"{SOURCE}.name", f"{SOURCE}.name", "expected a string matching", NAMES),
    (f"{SOURCE}.uri", f"{SOURCE}.uri", "expected a URI with", PATHS),
    (f"{SOURCE}.success_marker", f"{SOURCE}.success_marker", "expected a file name inside the partition", PATHS),
    (f"{SOURCE}.connection_id", f"{SOURCE}.connection_id", "expected an Airflow connection id", NAMES),
    ("spec.dataset.streams.1.sources.0.kafka.topic", "spec.dataset.streams[1].sources[0].kafka.topic", "expected a Kafka topic name", NAMES),
    ("spec.dataset.streams.1.sources.0.kafka.connection_id", "spec.dataset.streams[1].sources[0].kafka.connection_id", "expected an Airflow connection id", NAMES),
    ("spec.storage.root", "spec.storage.root", "expected a storage root", PATHS),
    ("spec.storage.connection_id", "spec.storage.connection_id", "expected an Airflow connection id", NAMES),
]  # fmt: skip # a table: one field per row, its four columns read across
SHAPED = {  # fields whose value is part of a larger one
    f"{SOURCE}.uri": "file:///data/{v}/{{YYYY}}{{MM}}{{DD}}/{{HH}}/",
    "spec.storage.root": "/var/lib/{v}/jobs",
    "spec.resources.clusters.0.kubeconfig": "/home/me/{v}/config",
}
REFUSED = [(c, name) for c in FIELD_CASES for name in sorted(c[3])]


@pytest.mark.parametrize(("case", "value"), REFUSED, ids=[f"{c[1]}-{name}" for c, name in REFUSED])
def test_hostile_values_are_refused_naming_the_field(tmp_path, case, value):
    where, path, says, _ = case
    hostile = HOSTILE[value]
    doc = _doc()
    if "clusters" in where:
        _cluster(doc)
    if "command" in where:
        doc["spec"]["resources"]["roles"]["trainer"]["command"] = ["primus", "train", "{SPEC}"]
    _set(where, SHAPED.get(where, "{v}").format(v=hostile))(doc)
    spec = _write(tmp_path, doc)
    with pytest.raises(SpecError) as caught:
        load_job(spec, env={})
    lines = str(caught.value).splitlines()
    if "<key>" in path:  # a key with a control character is shown escaped, in brackets: still one line
        path = path.replace(".<key>", f"[{hostile!r}]" if any(c in hostile for c in "\n\x00") else f".{hostile}")
    assert any(line.startswith(f"{spec}: {path}: {says}") for line in lines), lines
    assert all(line.startswith(f"{spec}: ") and ": expected " in line and ", found " in line for line in lines)


def test_the_free_fields_accept_what_their_consumers_keep_literal(tmp_path):
    """What is not refused is carried literally: a path may hold '$(id)' or ';' (never a shell word)."""
    doc = _cluster(_doc(), context="ctx;$(id)", kubeconfig="/home/me/$(id);x/config", queue="root.ads")
    _source(doc)["uri"] = "file:///data/$(id);x/{YYYY}{MM}{DD}/{HH}/"
    doc["spec"]["resources"]["roles"]["trainer"]["command"] = ["sh", "-c", "echo $(id); `id`\nexit 0", "../.."]
    job = load_job(_write(tmp_path, doc), env={})
    assert job.spec.dataset.streams[0].sources[0].uri == "file:///data/$(id);x/{YYYY}{MM}{DD}/{HH}/"
    assert job.spec.resources.clusters[0].kubeconfig == "/home/me/$(id);x/config"
    assert job.spec.resources.roles["trainer"].command[2:] == ["echo $(id); `id`\nexit 0", "../.."]


YAML_CASES = [
    (
        "alias-bomb",
        "\n".join(
            ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
            + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
        ),
        "(document): expected at most 100000 values (YAML aliases are expanded)",
    ),
    (
        "python-tag-runs-nothing",
        "!!python/object/apply:os.system ['touch {tmp}/pwned']",
        "line 1, column 1: expected valid YAML, found could not determine a constructor",
    ),
    (
        "not-a-mapping",
        "- apiVersion\n- kind\n",
        "(document): expected a mapping with apiVersion, kind, metadata, spec, found list",
    ),
    ("empty-file", "", "(document): expected a mapping with apiVersion, kind, metadata, spec, found NoneType"),
    ("broken-yaml", "apiVersion: [unclosed\n", "line 2, column 1: expected valid YAML"),
]


@pytest.mark.parametrize(("text", "says"), [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_hostile_yaml_is_one_line(tmp_path, text, says):
    spec = tmp_path / "job.yaml"
    spec.write_text(text.replace("{tmp}", str(tmp_path)))
    with pytest.raises(SpecError) as caught:
        load_job(spec, env={})
    assert str(caught.value) == f"{spec}: {says}" or str(caught.value).startswith(f"{spec}: {says}")
    assert not (tmp_path / "pwned").exists()


def test_binary_file_and_directory_are_named(tmp_path):
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"apiVersion: \xff\xfe\x00garbage")
    with pytest.raises(
        SpecError, match=r"job.yaml: \(file\): expected a UTF-8 text file, found byte 0xff at offset 12"
    ):
        load_job(binary, env={})
    with pytest.raises(SpecError, match=r": \(file\): expected a readable YAML file, found Is a directory"):
        load_job(tmp_path, env={})


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "primus_lib.cli.main", *args]
    return subprocess.run(command, env=env or dict(os.environ), capture_output=True, text=True, timeout=120)


def test_validate_reports_every_hostile_spec_one_line_each(tmp_path):
    specs = [str(CORPUS / f"{name}.yaml") for name in HOSTILE_CORPUS]
    doc = _doc()
    _place(doc, "uri", "file://${DATA}/impressions/{YYYY}/")
    specs.append(str(_write(tmp_path, doc, "env.yaml")))
    env = {**os.environ, "DATA": "/srv/../../etc"}
    done = _cli("validate", *specs, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.splitlines()
    for spec in specs:
        mine = [line for line in lines if line.startswith(f"{spec}: ")]
        assert mine, f"nothing about {spec}"
        assert all(": expected " in line and ", found " in line for line in mine), mine
    assert len(lines) == sum(1 for line in lines if any(line.startswith(f"{s}: ") for s in specs))


@pytest.mark.parametrize("command", ["plan", "eval"])
def test_commands_refuse_a_hostile_spec_before_touching_anything(tmp_path, command):
    spec = CORPUS / "uri-dotdot.yaml"
    extra = {"plan": ["--dry-run"], "eval": ["--out", str(tmp_path / "out")]}[command]
    done = _cli(command, str(spec), *extra, env={**os.environ, "PRIMUS_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"{spec}: spec.dataset.streams[0].sources[0].uri: expected a URI without '..' segments (name the directory "
        "itself, absolute), found 'file:///data/impressions/../../../etc/{YYYY}/'"
    ]
    assert not (tmp_path / "home").exists() and not (tmp_path / "out").exists()


def test_plan_refuses_a_bad_instant_in_one_line(tmp_path):
    spec = _write(tmp_path, copy.deepcopy(_doc()))
    done = _cli("plan", str(spec), "--dry-run", "--start", "yesterday")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        == "primus plan: --start: expected an ISO instant like 2026-11-01T00:00:00Z, got 'yesterday'"
    )


@pytest.mark.parametrize(
    ("command", "stream", "says"),
    [
        ("plan", "nosuch", "primus plan: --stream: expected a batch stream of job 'ctr-demo' (history), got 'nosuch'"),
        (
            "plan",
            "realtime",
            "primus plan: --stream: expected a batch stream of job 'ctr-demo' (history), got 'realtime'",
        ),
        (
            "executor",
            "history",
            "primus executor: --stream: expected a stream of kind stream of job 'ctr-demo' (realtime), got 'history'",
        ),
    ],
)
def test_a_stream_the_job_lacks_is_refused_in_one_line(tmp_path, command, stream, says):
    spec = _write(tmp_path, copy.deepcopy(_doc()))
    extra = ["--dry-run"] if command == "plan" else []
    done = _cli(command, str(spec), *extra, "--stream", stream)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == says
