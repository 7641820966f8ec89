"""Cross-field checks that a single field's type cannot express."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from primus_lib.spec.errors import Problem, describe
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.resources import RoleSpec
from primus_lib.spec.safety import check_safety
from primus_lib.timegrid import EPOCH, iso, on_grid

PLACEHOLDERS = {"YYYY": "year", "MM": "month", "DD": "day", "HH": "hour"}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
URI_SCHEMES = ("file", "s3", "hdfs", "webhdfs")
REQUIRED_ROLES = ("trainer",)
# The data stream kinds each training mode reads: the one table of the modes (names in
# training.TrainingMode). primus_lib.train.model.modes derives the trainer's and eval's rules from it.
MODE_NEEDS: dict[str, tuple[str, ...]] = {
    "mtrm": ("batch", "stream"),
    "single_tower": ("batch", "stream"),
    "offline": ("batch",),
    "online": ("stream",),
    "offline_then_online": ("batch", "stream"),
}


def check_job(job: PrimusJob) -> list[Problem]:
    return [
        *_timer(job),
        *_streams(job),
        *_features(job),
        *_training(job),
        *_resources(job),
        *_scaling(job),
        *check_safety(job),
    ]


def _timer(job: PrimusJob) -> Iterator[Problem]:
    timer = job.spec.timer
    if timer.end is not None and timer.end <= timer.start:
        yield Problem("spec.timer.end", f"an instant after start ({iso(timer.start)})", iso(timer.end))
    for name, instant in (("start", timer.start), ("end", timer.end)):
        if instant is not None and not on_grid(instant, timer.window_size, EPOCH):
            yield Problem(f"spec.timer.{name}", f"an instant on a {timer.window} boundary (UTC)", iso(instant))


def _streams(job: PrimusJob) -> Iterator[Problem]:
    streams = job.spec.dataset.streams
    yield from _duplicates([s.name for s in streams], "spec.dataset.streams[{}].name", "a unique stream name")
    for i, stream in enumerate(streams):
        base = f"spec.dataset.streams[{i}]"
        yield from _duplicates(
            [s.name for s in stream.sources], base + ".sources[{}].name", "a source name unique in its stream"
        )
        for j, source in enumerate(stream.sources):
            yield from _source(job, stream.kind, source, f"{base}.sources[{j}]")
        if stream.kind == "batch" and len(stream.sources) > 1 and stream.join is None:
            yield Problem(
                f"{base}.join", f"a join (keys) for the {len(stream.sources)} sources of a batch stream", "nothing"
            )
        if stream.join is not None:
            known = set(job.spec.features.columns) | set(stream.join.keys)
            if job.spec.features.id:
                known.add(job.spec.features.id)
            for column in stream.join.fill:
                if column not in known:
                    yield Problem(
                        f"{base}.join.fill.{column}",
                        "a feature column (label, timestamp, sparse or dense)",
                        repr(column),
                    )
            if len(stream.sources) < 2:
                yield Problem(f"{base}.join", "at least two sources to join", f"{len(stream.sources)} source")


def _source(job: PrimusJob, kind: str, source, path: str) -> Iterator[Problem]:
    if source.uri is None and source.kafka is None:
        yield Problem(path, "a 'uri' (files) or a 'kafka' block", "neither")
        return
    if source.uri is not None and source.kafka is not None:
        yield Problem(path, "either 'uri' or 'kafka', not both", "both")
    if kind == "batch" and source.kafka is not None:
        yield Problem(f"{path}.kafka", "no kafka block in a batch stream (batch sources are files)", "a kafka block")
    if source.kafka is not None:
        if source.format not in ("json", "jsonl"):
            yield Problem(f"{path}.format", "'json' for a kafka source", repr(source.format))
        if source.kafka.startup == "timestamp" and source.kafka.startup_timestamp is None:
            yield Problem(f"{path}.kafka.startup_timestamp", "an instant when startup is 'timestamp'", "nothing")
    if source.start is not None and source.end is not None and source.end <= source.start:
        yield Problem(f"{path}.end", f"an instant after start ({iso(source.start)})", iso(source.end))
    if source.uri is not None:
        yield from _uri(job, kind, source.uri, f"{path}.uri")


def _uri(job: PrimusJob, kind: str, uri: str, path: str) -> Iterator[Problem]:
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in URI_SCHEMES:
        yield Problem(path, "a URI with scheme " + ", ".join(f"{s}://" for s in URI_SCHEMES), repr(uri))
    names = _PLACEHOLDER.findall(uri)
    for name in names:
        if name not in PLACEHOLDERS:
            yield Problem(path, "placeholders among {YYYY} {MM} {DD} {HH}", "{" + name + "}")
    if kind == "batch" and "HH" in names and job.spec.timer.window == "1d":
        yield Problem(path, "no placeholder finer than the 1d window ({HH} is hourly)", "{HH}")


def _features(job: PrimusJob) -> Iterator[Problem]:
    features = job.spec.features
    names = [features.label, features.timestamp, *(f.name for f in features.sparse), *features.dense]
    paths = ["spec.features.label", "spec.features.timestamp"]
    paths += [f"spec.features.sparse[{i}].name" for i in range(len(features.sparse))]
    paths += [f"spec.features.dense[{i}]" for i in range(len(features.dense))]
    seen: set[str] = set()
    for name, path in zip(names, paths, strict=False):
        if name in seen:
            yield Problem(path, "a column used once among label, timestamp, sparse and dense", repr(name))
        seen.add(name)


def _training(job: PrimusJob) -> Iterator[Problem]:
    training = job.spec.training
    kinds = {s.kind for s in job.spec.dataset.streams}
    stream_names = [s.name for s in job.spec.dataset.streams]
    for name, weight in training.priority.items():
        if name not in stream_names:
            yield Problem(f"spec.training.priority.{name}", "a stream name: " + ", ".join(stream_names), repr(name))
        if weight <= 0:
            yield Problem(f"spec.training.priority.{name}", "a positive weight", describe(weight))
    for needed in MODE_NEEDS[training.mode]:
        if needed not in kinds:
            yield Problem(
                "spec.training.mode",
                f"a {needed} stream in spec.dataset for mode {training.mode!r}",
                f"no {needed} stream",
            )
    if training.sharding == "replicate" and job.trainer_gpus:  # GPUs held, never used
        yield Problem(
            "spec.training.sharding",
            f"dmp or no setting for a trainer with GPUs (replicated tables train on the CPU; the trainer "
            f"asks for {job.trainer_gpus} GPU(s) in spec.resources.roles.trainer.gpu)",
            "'replicate'",
        )


def _resources(job: PrimusJob) -> Iterator[Problem]:
    resources = job.spec.resources
    for name in REQUIRED_ROLES:
        if name not in resources.roles:
            yield Problem("spec.resources.roles", f"a role named {name!r}", ", ".join(resources.roles) or "no roles")
    for name, role in resources.roles.items():
        yield from _role(job, name, role, f"spec.resources.roles.{name}")
    for i, cluster in enumerate(resources.clusters):
        if cluster.backend == "yarn" and not cluster.resource_manager:
            yield Problem(f"spec.resources.clusters[{i}].resource_manager", "a ResourceManager URL for yarn", "nothing")
    yield from _duplicates(
        [c.name for c in resources.clusters], "spec.resources.clusters[{}].name", "a unique cluster name"
    )


def _role(job: PrimusJob, name: str, role: RoleSpec, path: str) -> Iterator[Problem]:
    if role.min_count > role.max_count:
        yield Problem(f"{path}.min_replicas", f"at most max_replicas ({role.max_count})", str(role.min_count))
    elif not role.min_count <= role.replicas <= role.max_count:
        yield Problem(
            f"{path}.replicas",
            f"between min_replicas and max_replicas ({role.min_count}..{role.max_count})",
            str(role.replicas),
        )
    for other in role.start_after:
        if other not in job.spec.resources.roles or other == name:
            yield Problem(f"{path}.start_after", "names of other roles of this job", repr(other))
    if job.spec.resources.backend != "local" and not role.image:
        yield Problem(f"{path}.image", f"a container image for backend {job.spec.resources.backend!r}", "nothing")


def _scaling(job: PrimusJob) -> Iterator[Problem]:
    weights = job.spec.scaling.horizontal.weights
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        yield Problem(
            "spec.scaling.horizontal.weights", "three non-negative weights with a positive sum", describe(weights)
        )
    if job.spec.scaling.horizontal.enabled and "data_executor" not in job.spec.resources.roles:
        yield Problem(
            "spec.resources.roles",
            "a role named 'data_executor' when horizontal scaling is enabled",
            ", ".join(job.spec.resources.roles),
        )


def _duplicates(names: list[str], template: str, expected: str) -> Iterator[Problem]:
    counts = Counter(names)
    seen: set[str] = set()
    for i, name in enumerate(names):
        if counts[name] > 1 and name in seen:
            yield Problem(template.format(i), expected, repr(name))
        seen.add(name)
