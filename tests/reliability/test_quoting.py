"""Spec values that validation accepts reach pods and launch scripts literally: a role's command
with ``$(VAR)``, ``;``, backquotes, ``..``, quotes and newlines arrives as exactly the argv the
spec wrote, one element per element, on Kubernetes (after the kubelet's ``$(VAR)`` expansion) and
on YARN (after the NodeManager's launch script, written as Hadoop writes it)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from primus_lib.resources.base import ResourceError
from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.names import SPEC_FILE
from primus_lib.resources.yarn.backend import YarnBackend
from primus_lib.resources.yarn.client import AM_MODULE, submission_context
from primus_lib.resources.yarn.ipc import decode_command
from tests.fixtures.specs import DEMO_ROLES, demo_doc, load

HOSTILE_ARGV = [
    "python",
    "-c",
    "import sys; print(sys.argv)",
    "$(PRIMUS_DATABASE_PASSWORD)",
    "$(id)",
    "$$(id)",
    "$HOME",
    "`id`",
    "a;rm -rf /",
    "../../etc/passwd",
    'it\'s "quoted"',
    "line one\nline two",
    "a b\tc",
    "$",
    "{SPEC}",
]


def _job(tmp_path, backend: str, python: str | None = None):
    storage = {"root": str(tmp_path / "jobs"), "database": "postgresql+psycopg2://primus:${DB_PASSWORD}@db:5432/primus"}
    roles = {name: {**role, "image": "primus:0.1.0"} for name, role in DEMO_ROLES.items()}
    roles["trainer"].update(image="registry.example.com:5000/ml/primus-trainer:0.1.0", command=HOSTILE_ARGV)
    roles["stream_executor"]["command"] = HOSTILE_ARGV
    resources = None
    if backend == "yarn":
        cluster = {"name": "y1", "backend": "yarn", "resource_manager": "http://rm:8088", "python": python}
        resources = {"clusters": [cluster]}
    doc = demo_doc(
        f"file://{tmp_path}/data",
        hours=3,
        rows_per_shard=100,
        storage=storage,
        backend=backend,
        resources=resources,
        roles=roles,
    )
    return load(doc, env={"DB_PASSWORD": "s3cr3t", "HOME": "/home/me"})


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a container's command and env values (third_party/forked/golang/
    expansion): $(NAME) -> its value when NAME is defined (else left as written), $$ -> $."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end < 0:
                    out.append(text[i:])
                    break
                name = text[i + 2 : end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _pod_env(container: dict) -> dict[str, str]:
    env = {"PRIMUS_DATABASE_PASSWORD": "s3cr3t", "POD_NAME": "p-0", "POD_IP": "10.0.0.1"}  # what the kubelet fills
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = kubelet_expand(var["value"], env)
    return env


def _containers(job) -> list[dict]:
    objects = [
        m.trainer_job(job, indexed=True),
        m.trainer_job(job, indexed=False),
        m.pytorch_job(job),
        m.statefulset(job, "stream_executor"),
    ]
    out = []
    for body in objects:
        spec = body["spec"]
        templates = (
            [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
            if "pytorchReplicaSpecs" in spec
            else [spec["template"]]
        )
        out += [t["spec"]["containers"][0] for t in templates]
    return out


def test_kubernetes_containers_get_the_spec_command_literally(tmp_path):
    job = _job(tmp_path, "kubernetes")
    intended = [part.replace("{SPEC}", SPEC_FILE) for part in HOSTILE_ARGV]
    containers = _containers(job)
    assert len(containers) == 4
    for container in containers:
        env = _pod_env(container)
        assert [kubelet_expand(part, env) for part in container["command"]] == intended
        assert "s3cr3t" not in json.dumps(container)  # the Secret's value is never in the object
        assert env["PRIMUS_JOB"] == job.name and env["PRIMUS_ROLE"] in ("trainer", "stream_executor")
    assert kubelet_expand("$(PRIMUS_DATABASE_PASSWORD)", _pod_env(containers[0])) == "s3cr3t"  # what $$ prevents


def test_kubernetes_default_commands_keep_their_own_expansion(tmp_path):
    """Only the spec's values are escaped: the Indexed Job's rank still comes from the kubelet."""
    roles = {name: {**role, "image": "primus:0.1.0"} for name, role in DEMO_ROLES.items()}
    doc = demo_doc(f"file://{tmp_path}/data", hours=3, rows_per_shard=100, backend="kubernetes", roles=roles)
    job = load(doc, env={})
    container = m.trainer_job(job, indexed=True)["spec"]["template"]["spec"]["containers"][0]
    expanded = [kubelet_expand(part, {"JOB_COMPLETION_INDEX": "3"}) for part in container["command"]]
    assert "--node-rank=3" in expanded


class FakeRM:
    """Records the submission context the backend sends (no ResourceManager needed)."""

    url, user = "http://rm:8088", "primus"  # the cluster's key (staging.JobSecrets) and user

    def __init__(self) -> None:
        self.contexts: list[dict] = []

    def new_application(self) -> dict:
        return {"application-id": f"application_1_{len(self.contexts) + 1:04d}"}

    def submit(self, context: dict) -> None:
        self.contexts.append(context)

    def scheduler_address(self) -> str:
        return "rm:8030"


def _yarn_context(tmp_path, monkeypatch, python: str, spec_path: str, role: str = "trainer") -> dict:
    job = _job(tmp_path, "yarn", python)
    rm = FakeRM()
    YarnBackend(job, spec_path, client=rm)._start_worker(role, 0)
    return rm.contexts[-1]


def launch_script(context: dict) -> str:
    """The container's launch script as Hadoop's NodeManager writes it (ContainerLaunch's
    UnixShellScriptBuilder: ``export KEY="VALUE"`` per variable, ``exec /bin/bash -c "COMMAND"``),
    with <LOG_DIR> replaced by the container's log directory."""
    spec = context["am-container-spec"]
    lines = ["#!/bin/bash"] + [f'export {e["key"]}="{e["value"]}"' for e in spec["environment"]["entry"]]
    return "\n".join([*lines, f'exec /bin/bash -c "{spec["commands"]["command"]}"'])


@pytest.mark.parametrize("python", [sys.executable, "/opt/my envs/py;thon &x", "/opt/(py) <env>/python|x"])
def test_yarn_launch_command_is_one_argv_and_the_role_command_is_exact(tmp_path, monkeypatch, python):
    spec_path = str(tmp_path / "my specs" / "job;$(id).yaml")
    context = _yarn_context(tmp_path, monkeypatch, python, spec_path)
    command = context["am-container-spec"]["commands"]["command"]
    argv = shlex.split(command)
    assert argv[:5] == [python, "-m", AM_MODULE, "--scheduler", "rm:8030"] and argv[5] == "--command"
    assert argv[7:] == ["1><LOG_DIR>/stdout", "2><LOG_DIR>/stderr"]
    env = {e["key"]: e["value"] for e in context["am-container-spec"]["environment"]["entry"]}
    intended = [part.replace("{SPEC}", spec_path) for part in HOSTILE_ARGV]
    assert decode_command(argv[6]) == intended
    assert env["PRIMUS_JOB"] == "ctr-demo" and env["PRIMUS_ROLE"] == "trainer"


def test_the_nodemanager_launch_script_runs_exactly_the_am_and_its_argv(tmp_path, monkeypatch):
    """Run the launch script as the NodeManager would: the AM (a stand-in printing its argv and
    the decoded role command) starts with the intended argv and environment."""
    stand_in = tmp_path / "bin dir;x" / "py (thon)"
    stand_in.parent.mkdir()
    stand_in.write_text(
        f"#!{sys.executable}\nimport base64, json, os, sys\n"
        "print(json.dumps([sys.argv[1:-1], json.loads(base64.b64decode(sys.argv[-1])),"
        " os.environ['PRIMUS_JOB'], os.environ['PRIMUS_ROLE']]))\n"
    )
    stand_in.chmod(0o755)
    spec_path = str(tmp_path / "job.yaml")
    context = _yarn_context(tmp_path, monkeypatch, str(stand_in), spec_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    script = launch_script(context).replace("<LOG_DIR>", str(logs))
    done = subprocess.run(
        ["/bin/bash", "-c", script], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    argv, role_command, job, role = json.loads((logs / "stdout").read_text())
    assert argv == ["-m", AM_MODULE, "--scheduler", "rm:8030", "--command"]
    assert role_command == [part.replace("{SPEC}", spec_path) for part in HOSTILE_ARGV]
    assert (job, role) == ("ctr-demo", "trainer")


@pytest.mark.parametrize("value", ['a"b', "a$(id)", "a`id`", "a\\b", "a\nb", "${HOME}", "{{HOME}}", "it's"])
def test_yarn_refuses_what_the_launch_script_would_interpret(tmp_path, monkeypatch, value):
    """The NodeManager does not escape: a passed-through PRIMUS_* value, or the AM's interpreter path,
    with shell syntax is refused, naming the variable without showing the value (it may be a secret)."""
    if value != "it's":  # a quote in a value is fine: only its shlex-quoted form in the command is not
        monkeypatch.setenv("PRIMUS_SOME_SETTING", "secret-" + value)
        with pytest.raises(ResourceError, match=r"launch script, PRIMUS_SOME_SETTING: expected no") as caught:
            _yarn_context(tmp_path, monkeypatch, sys.executable, str(tmp_path / "job.yaml"))
        assert "secret-" not in str(caught.value)
    with pytest.raises(ResourceError, match=r"launch script, \(the AM command\): expected no"):
        submission_context("application_1_0001", "j-r-0", ["true"], 1, 2**30, "default", [], {}, 1, f"/opt/{value}/py")
