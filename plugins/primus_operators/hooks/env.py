"""Collect the environment a job's connections imply, and apply it around a task's work."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primus_lib.spec import PrimusJob


def job_connection_env(job: PrimusJob) -> dict[str, str]:
    """Env for every ``connection_id`` the spec names (the job's shared state: ``storage``; storage
    per source, Kafka per stream source). Values are secrets: callers put them in a process's
    environment only, never in a spec, an XCom, a log line or a command line. The Kafka modules
    (confluent-kafka, ~0.25 s) load only for a Kafka connection: every data task calls this."""
    from primus_operators.hooks.storage import PrimusStorageHook

    env: dict[str, str] = {}
    owners: dict[str, str] = {}
    if job.spec.storage.connection_id:
        _merge(env, owners, PrimusStorageHook(job.spec.storage.connection_id).env(), "spec.storage.connection_id")
    for stream in job.spec.dataset.streams:
        for source in stream.sources:
            where = f"spec.dataset.streams[{stream.name}].sources[{source.name}]"
            if source.connection_id:
                _merge(env, owners, PrimusStorageHook(source.connection_id).env(), f"{where}.connection_id")
            if source.kafka is not None and source.kafka.connection_id:
                from primus_lib.data.sources.kafka import connection_env_key
                from primus_operators.hooks.kafka import PrimusKafkaHook

                config = PrimusKafkaHook(source.kafka.connection_id).client_config()
                key = connection_env_key(stream, source)  # read back by the data plane's Kafka clients
                _merge(env, owners, {key: json.dumps(config, sort_keys=True)}, f"{where}.kafka.connection_id")
    return env


def _merge(env: dict[str, str], owners: dict[str, str], new: dict[str, str], where: str) -> None:
    for key, value in new.items():
        if key in env and env[key] != value:
            raise ValueError(
                f"{where}: connection sets {key} differently from {owners[key]}; one process holds one value"
            )
        env[key] = value
        owners.setdefault(key, where)


@contextlib.contextmanager
def connection_env(job: PrimusJob) -> Iterator[dict[str, str]]:
    """Set the job's connection env in this (task) process for the duration of the block."""
    with applied_env(job_connection_env(job)) as env:
        yield env


@contextlib.contextmanager
def applied_env(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Set ``env`` in this process for the duration of the block, then restore what was there."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
