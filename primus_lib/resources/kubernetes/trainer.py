"""Recreating the trainer's Job: a Job's pod template is immutable, so a trainer resize (or a scale-up
past its completions) deletes the Job with foreground propagation and creates it again."""

from __future__ import annotations

import time

from primus_lib.resources.base import ResourceError
from primus_lib.spec.units import parse_quantity

RECREATE_TIMEOUT_SECONDS = 60.0


def recreate_trainer(backend, obj: dict, replicas: int | None = None, cpu=None, memory=None) -> None:
    """``backend``: the KubernetesBackend; ``obj``: the trainer Job as read (a dict)."""
    from kubernetes.client.rest import ApiException

    requests = obj["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    replicas = obj["spec"]["completions"] if replicas is None else replicas
    cpu = parse_quantity(requests["cpu"]) if cpu is None else cpu
    memory = parse_quantity(requests["memory"]) if memory is None else memory
    uid = obj["metadata"].get("ownerReferences", [{}])[0].get("uid")
    body = backend.workload("trainer", uid, replicas, cpu, memory)
    name, batch, ns = obj["metadata"]["name"], backend.cluster.batch, backend.ns
    # Foreground: the Job object lasts until the garbage collector has deleted its pods, so the new
    # Job's pods never meet the old ones (two trainers with one rank) or their resources.
    batch.delete_namespaced_job(name, ns, propagation_policy="Foreground")
    deadline = time.monotonic() + RECREATE_TIMEOUT_SECONDS
    while True:
        try:
            batch.create_namespaced_job(ns, body)
            return
        except ApiException as exc:
            if getattr(exc, "status", None) != 409 or time.monotonic() > deadline:
                raise ResourceError(
                    f"job {backend.job.name!r}: recreating trainer Job {name} failed: {exc.body}"
                ) from exc
            time.sleep(0.2)
