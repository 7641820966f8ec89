"""Checks against hostile values: paths that leave their declared roots, names that would
become paths, shell words or other systems' names, and sizes that would exhaust a cluster.

A spec is input from people and from ``${VAR}`` expansion; a value that parses is not yet a
value that is safe to turn into a path, a topic, a pod or a thousand processes. These bounds
live here (not in the field types) so the generated CRD stays as it is. A role's ``command`` is
the one free-form value that reaches a process: every backend runs it in exec form (no shell),
and the Kubernetes manifests escape its ``$`` (kubernetes/pods.literal), so it is refused only a NUL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from primus_lib.spec import names
from primus_lib.spec.errors import Problem, describe
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.names import has_control

MAX_REPLICAS = 1000  # per role: more is a typo or an attack, not a job
MAX_GPUS = 16  # per replica: no machine has more
MAX_BUCKETS = 2**31 - 1  # embedding rows per sparse feature (int32 row ids)
MAX_EMBEDDING_DIM = 4096
MAX_BATCH_SIZE = 2**20
__all__ = ["check_safety", "has_control"]


def check_safety(job: PrimusJob) -> Iterator[Problem]:
    yield from _paths(job)
    yield from _kubernetes(job)
    yield from _roles(job)
    yield from _clusters(job)
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
                if not names.is_topic(kafka.topic):
                    yield Problem(f"{base}.kafka.topic", "a Kafka topic name of [A-Za-z0-9._-]", describe(kafka.topic))
                for name in ("bootstrap_servers", "group_id"):
                    value = getattr(kafka, name)
                    if value is not None and has_control(value):
                        yield Problem(f"{base}.kafka.{name}", "a value without control characters", describe(value))
                yield from _connection(kafka.connection_id, f"{base}.kafka.connection_id")
            yield from _connection(source.connection_id, f"{base}.connection_id")
    yield from _connection(job.spec.storage.connection_id, "spec.storage.connection_id")
    yield from _connection(job.spec.storage.database_connection_id, "spec.storage.database_connection_id")


def _path_like(value: str, path: str, what: str) -> Iterator[Problem]:
    if has_control(value):
        yield Problem(path, f"{what} without control characters (newline, tab, NUL)", describe(value))
    _, _, rest = value.rpartition("://")
    if ".." in rest.split("?", 1)[0].split("/"):
        yield Problem(path, f"{what} without '..' segments (name the directory itself, absolute)", describe(value))


def _kubernetes(job: PrimusJob) -> Iterator[Problem]:
    """Namespaces and labels reach the API server's objects as they are."""
    namespaces = [
        ("metadata.namespace", job.metadata.namespace),
        ("spec.resources.namespace", job.spec.resources.namespace),
    ]
    namespaces += [
        (f"spec.resources.clusters[{i}].namespace", c.namespace) for i, c in enumerate(job.spec.resources.clusters)
    ]
    for path, value in namespaces:
        if value is not None and not names.matches(names.DNS_LABEL, value):
            yield Problem(path, "a Kubernetes namespace (RFC 1123 label: a-z, 0-9, '-', at most 63)", describe(value))
    for key, value in job.metadata.labels.items():
        if not names.is_label_key(key):
            yield Problem(
                _member("metadata.labels", key),
                "a label key ([PREFIX/]NAME: A-Z, a-z, 0-9, '-_.', at most 63)",
                describe(key),
            )
        elif not names.matches(names.LABEL_VALUE, value):
            yield Problem(
                _member("metadata.labels", key), "a label value (A-Z, a-z, 0-9, '-_.', at most 63)", describe(value)
            )
    for key in job.metadata.annotations:
        if not names.is_label_key(key):
            yield Problem(_member("metadata.annotations", key), "an annotation key ([PREFIX/]NAME)", describe(key))


def _roles(job: PrimusJob) -> Iterator[Problem]:
    for name, role in job.spec.resources.roles.items():
        base = _member("spec.resources.roles", name)
        if not names.matches(names.ROLE_NAME, name):
            yield Problem(base, f"a role name matching ^{names.ROLE_NAME.pattern}$", describe(name))
        if role.image is not None and not names.is_image(role.image):
            yield Problem(
                f"{base}.image", "a container image like registry:5000/team/name:tag[@sha256:...]", describe(role.image)
            )
        for i, part in enumerate(role.command or []):
            if "\x00" in part:
                yield Problem(
                    f"{base}.command[{i}]", "an argument without NUL (no process can take one)", describe(part)
                )


def _clusters(job: PrimusJob) -> Iterator[Problem]:
    for i, cluster in enumerate(job.spec.resources.clusters):
        base = f"spec.resources.clusters[{i}]"
        if not names.matches(names.CLUSTER_NAME, cluster.name):
            yield Problem(f"{base}.name", "a cluster name (A-Z, a-z, 0-9, '-_.', at most 63)", describe(cluster.name))
        for field in ("context", "kubeconfig"):
            value = getattr(cluster, field)
            if value is not None and has_control(value):
                yield Problem(f"{base}.{field}", "a value without control characters", describe(value))
        rm = cluster.resource_manager
        if rm is not None and (not rm.startswith(("http://", "https://")) or has_control(rm) or " " in rm):
            yield Problem(f"{base}.resource_manager", "an http(s)://HOST:PORT URL of the ResourceManager", describe(rm))
        if not names.matches(names.YARN_QUEUE, cluster.queue):
            yield Problem(
                f"{base}.queue", "a YARN queue name or path (A-Z, a-z, 0-9, '-_', '.' between)", describe(cluster.queue)
            )


def _member(path: str, key: str) -> str:
    """The path of a mapping's member; a key with a control character in brackets, escaped (one line)."""
    return f"{path}[{key!r}]" if has_control(key) else f"{path}.{key}"


def _connection(value: str | None, path: str) -> Iterator[Problem]:
    if value is not None and not names.matches(names.CONNECTION_ID, value):
        yield Problem(path, "an Airflow connection id (A-Z, a-z, 0-9, '_.-')", describe(value))


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
