"""Checks against hostile values: paths that leave their declared roots, names that would
become paths or shell words, and sizes that would exhaust a cluster.

A spec is input from people and from ``${VAR}`` expansion; a value that parses is not yet a
value that is safe to turn into a path, a topic or a thousand processes. These bounds live
here (not in the field types) so the generated CRD stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

from primus_lib.spec.errors import Problem, describe
from primus_lib.spec.job import PrimusJob

MAX_REPLICAS = 1000  # per role: more is a typo or an attack, not a job
MAX_GPUS = 16  # per replica: no machine has more
MAX_BUCKETS = 2**31 - 1  # embedding rows per sparse feature (int32 row ids)
MAX_EMBEDDING_DIM = 4096
MAX_BATCH_SIZE = 2**20
ROLE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")  # becomes process, pod and directory names
KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's own rule for topic names
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """A newline, tab, NUL or other control character: never part of a path, name or URL."""
    return _CONTROL.search(text) is not None


def check_safety(job: PrimusJob) -> Iterator[Problem]:
    yield from _paths(job)
    yield from _sizes(job)
    yield from _intervals(job)


def _paths(job: PrimusJob) -> Iterator[Problem]:
    root = job.spec.storage.root
    if root is not None:
        yield from _path_like(root, "spec.storage.root", "a storage root")
    for i, stream in enumerate(job.spec.dataset.streams):
        for j, source in enumerate(stream.sources):
            base = f"spec.dataset.streams[{i}].sources[{j}]"
            if source.uri is not None:
                yield from _path_like(source.uri, f"{base}.uri", "a URI")
                yield from _authority(source.uri, f"{base}.uri")
            yield from _file_name(source.file_pattern, f"{base}.file_pattern", "a file-name glob")
            if source.success_marker is not None:
                yield from _file_name(source.success_marker, f"{base}.success_marker", "a file name")
            if source.kafka is not None:
                kafka = source.kafka
                if not KAFKA_TOPIC.match(kafka.topic) or kafka.topic in {".", ".."}:
                    yield Problem(f"{base}.kafka.topic", "a Kafka topic name of [A-Za-z0-9._-]", describe(kafka.topic))
                for name in ("bootstrap_servers", "group_id"):
                    value = getattr(kafka, name)
                    if value is not None and has_control(value):
                        yield Problem(f"{base}.kafka.{name}", "a value without control characters", describe(value))
    for name in job.spec.resources.roles:
        if not ROLE_NAME.match(name):
            yield Problem(f"spec.resources.roles.{name}", f"a role name matching {ROLE_NAME.pattern}", describe(name))


def _path_like(value: str, path: str, what: str) -> Iterator[Problem]:
    if has_control(value):
        yield Problem(path, f"{what} without control characters (newline, tab, NUL)", describe(value))
    _, _, rest = value.rpartition("://")
    if ".." in rest.split("?", 1)[0].split("/"):
        yield Problem(path, f"{what} without '..' segments (name the directory itself, absolute)", describe(value))


def _authority(uri: str, path: str) -> Iterator[Problem]:
    scheme, sep, rest = uri.partition("://")
    if sep and scheme == "s3" and not rest.split("/", 1)[0]:
        yield Problem(path, "s3://BUCKET/PREFIX with a bucket", describe(uri))


def _file_name(value: str, path: str, what: str) -> Iterator[Problem]:
    if not value or "/" in value or "\\" in value or value in {".", ".."} or has_control(value):
        yield Problem(
            path, f"{what} inside the partition directory (no '/', '..' or control characters)", describe(value)
        )


def _sizes(job: PrimusJob) -> Iterator[Problem]:
    for name, role in job.spec.resources.roles.items():
        base = f"spec.resources.roles.{name}"
        for field in ("replicas", "min_replicas", "max_replicas"):
            value = getattr(role, field)
            if value is not None and value > MAX_REPLICAS:
                yield Problem(f"{base}.{field}", f"at most {MAX_REPLICAS} replicas", str(value))
        if role.gpu > MAX_GPUS:
            yield Problem(f"{base}.gpu", f"at most {MAX_GPUS} GPUs per replica", str(role.gpu))
    for i, feature in enumerate(job.spec.features.sparse):
        if feature.buckets > MAX_BUCKETS:
            yield Problem(f"spec.features.sparse[{i}].buckets", f"at most {MAX_BUCKETS} buckets", str(feature.buckets))
    if job.spec.model.embedding_dim > MAX_EMBEDDING_DIM:
        dim = job.spec.model.embedding_dim
        yield Problem("spec.model.embedding_dim", f"at most {MAX_EMBEDDING_DIM}", str(dim))
    if job.spec.training.batch_size > MAX_BATCH_SIZE:
        yield Problem("spec.training.batch_size", f"at most {MAX_BATCH_SIZE}", str(job.spec.training.batch_size))


def _intervals(job: PrimusJob) -> Iterator[Problem]:
    """Zero intervals turn a periodic loop into a busy loop."""
    checkpoint = job.spec.training.checkpoint_interval
    if checkpoint is not None and checkpoint <= timedelta(0):
        yield Problem("spec.training.checkpoint_interval", "a positive duration (or none: every window)", "0s")
    if job.spec.scaling.interval <= timedelta(0):
        yield Problem("spec.scaling.interval", "a positive duration", "0s")
