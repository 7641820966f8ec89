"""The deployment settings: the only code of primus_lib and the plugin that reads the environment.

What a variable may hold is a fact of the deployment (where the job's home is, which Airflow API
to call, which replica this process is, where the mounted secrets are), never a switch of the
job's behaviour: that belongs in the spec (``primus_lib.spec``), and a test-only knob in a CLI
flag. ``tests/test_settings.py`` fails on any other read of ``os.environ`` in primus_lib, the
plugin and the DAGs, and on a docs table (docs/settings.md) that differs from ``table()``.

Besides the settings, two sanctioned views of the whole environment: ``spec_environment()`` for
``${VAR}`` in spec files (the spec's author names the variables) and ``child_environment()`` for
the environment a child process inherits (a role, the supervisor). Neither is read for a setting
or a credential. ``swap_environ`` sets variables for children and native libraries that read
their thread counts at start (``resources.limits``); credentials never travel this way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import get_args

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """One process's deployment facts; every field is read from the variable named by its alias."""

    model_config = SettingsConfigDict(case_sensitive=True, frozen=True, extra="ignore", populate_by_name=True)

    home: Path = Field(
        Path(".primus"),
        validation_alias="PRIMUS_HOME",
        description="Local directory of job state, `jobs/<job>` under it: the SQLite ledger, staging, resource "
        "tables, and everything of a job whose `spec.storage.root` is unset.",
    )
    jobs_dir: Path | None = Field(
        None,
        validation_alias="PRIMUS_JOBS_DIR",
        description="Folder of PrimusJob specs the DAG factory and the listeners read (unset: `config/jobs` of "
        "the checkout).",
    )
    secrets_dir: Path | None = Field(
        None,
        validation_alias="PRIMUS_SECRETS_DIR",
        description="Directory of mounted connection secrets, `<connection_id>.json` each (Airflow's connection "
        "JSON): where a process outside Airflow resolves the connections a spec names (docs/contracts.md).",
    )
    airflow_api: str | None = Field(
        None,
        validation_alias="PRIMUS_AIRFLOW_API",
        description="Airflow API server URL `primus backfill` calls (unset: the local `airflow` CLI).",
    )
    role: str | None = Field(
        None, validation_alias="PRIMUS_ROLE", description="The role this process runs, set by the resource backends."
    )
    replica_index: int | None = Field(
        None,
        ge=0,
        validation_alias="PRIMUS_REPLICA_INDEX",
        description="This worker's index in its role, set by the backends.",
    )
    replicas: int | None = Field(
        None, ge=0, validation_alias="PRIMUS_REPLICAS", description="Workers of this role now, set by the backends."
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        validation_alias="PRIMUS_METRICS_PORT",
        description="Also serve /metrics on 127.0.0.1:<port + worker offset> to scrapers presenting the bearer "
        "token of $PRIMUS_SECRETS_DIR/metrics.token (unset: snapshot files only).",
    )
    cgroup: str | None = Field(
        None,
        validation_alias="PRIMUS_CGROUP",
        description="`off`: no cgroups (the RSS guard caps memory); a directory: this process's own cgroup v2 "
        "(unset: read from /proc/self/cgroup).",
    )
    stream_executors: str | None = Field(
        None,
        validation_alias="PRIMUS_STREAM_EXECUTORS",
        description="Fixed stream-executor locations `grpc://host:port,...` (index = position), instead of the "
        "backend's discovery.",
    )
    kube_namespace: str | None = Field(
        None,
        validation_alias="PRIMUS_KUBE_NAMESPACE",
        description="Namespace the Kubernetes backend puts a job's workloads in (unset: the job's "
        "`metadata.namespace`, else `spec.resources.namespace`).",
    )
    nm_host: str | None = Field(
        None,
        validation_alias="NM_HOST",
        description="YARN's name of this container's node (set by the NodeManager): the host a stream executor "
        "announces.",
    )
    hadoop_token_file: Path | None = Field(
        None,
        validation_alias="HADOOP_TOKEN_FILE_LOCATION",
        description="The YARN container's token file (set by the NodeManager): the AM's AMRMToken.",
    )
    local_rank: int | None = Field(
        None,
        ge=0,
        validation_alias="LOCAL_RANK",
        description="This trainer process's rank on its node (set by torchrun).",
    )
    local_world_size: int | None = Field(
        None,
        ge=1,
        validation_alias="LOCAL_WORLD_SIZE",
        description="Trainer processes on this node (set by torchrun).",
    )


VARIABLES: tuple[str, ...] = tuple(str(f.validation_alias) for f in Settings.model_fields.values())
_cache: dict[tuple[str | None, ...], Settings] = {}


def settings() -> Settings:
    """The settings as the environment says now (cached per set of values: a test may change them).
    A value that does not parse is one line naming the variable and what was expected."""
    key = tuple(os.environ.get(name) for name in VARIABLES)
    found = _cache.get(key)
    if found is None:
        try:
            found = Settings()
        except ValidationError as exc:
            first = exc.errors()[0]
            name = first["loc"][0] if first["loc"] else "settings"
            raise ValueError(f"${name}={first.get('input')!r}: {first['msg'].lower()}") from None
        if len(_cache) > 64:
            _cache.clear()
        _cache[key] = found
    return found


def spec_environment() -> Mapping[str, str]:
    """What ``${VAR}`` in a spec file expands from: the process environment, read-only."""
    return os.environ


def child_environment(**extra: str) -> dict[str, str]:
    """A copy of this process's environment plus ``extra``: what a child process is started with."""
    return {**os.environ, **extra}


def swap_environ(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (None: unset) ``values`` in this process's environment for its children and for native
    libraries that read thread counts at start; returns what was there, to swap back."""
    previous = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return previous


# -- the docs table ----------------------------------------------------------------------------
BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"
_KINDS = {Path: "path", int: "integer", str: "text"}


def table() -> str:
    """The Markdown table of every variable, as docs/settings.md holds it between the markers."""
    rows = ["| variable | setting | type | default | what it is |", "|---|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        kind = _KINDS[next(t for t in (Path, int, str) if t == field.annotation or t in get_args(field.annotation))]
        default = "unset" if field.default is None else f"`{field.default}`"
        rows.append(f"| `{field.validation_alias}` | `{name}` | {kind} | {default} | {field.description} |")
    return "\n".join(rows)


def render(document: str) -> str:
    """``document`` with the text between the markers replaced by ``table()``."""
    from primus_lib.markdown import replace_block

    return replace_block(document, BEGIN, END, table())


if __name__ == "__main__":  # python -m primus_lib.settings docs/settings.md: rewrite the table
    page = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/settings.md")
    page.write_text(render(page.read_text(encoding="utf-8")), encoding="utf-8")
