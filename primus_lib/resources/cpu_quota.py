"""A worker's CPU allotment as a hard cap through the cgroup v1 ``cpu`` controller, where cgroup v2
gives the supervisor no ``cpu.max``.

On a hybrid hierarchy (controllers bound to cgroup v1, a v2 mount without them: the machine this was
built on, docs/scaling.md) a worker's ``cpu`` was only a pinning to ``ceil(cpu)`` cores, so an
allotment of 0.25 core could use a whole one. Here the supervisor moves the worker into a child of
this process's v1 cpu cgroup with ``cpu.cfs_quota_us = cpu x cpu.cfs_period_us``: the kernel
throttles it at its allotment, as Kubernetes does with a CPU limit, and its children with it. Only
fractional allotments: whole cores are what pinning gives already, and a cgroup would weigh all of a
worker's threads as one task under contention. ``PRIMUS_CGROUP`` set (``off``, or a cgroup v2
directory) leaves this off.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger("primus.resources.cpu_quota")

MIN_QUOTA_US = 1000  # the kernel's floor
DEFAULT_PERIOD_US = 100_000  # the kernel's default cpu.cfs_period_us


def own_v1_cpu_cgroup(membership: str, mounts: str) -> Path | None:
    """This process's cgroup directory in the v1 ``cpu`` hierarchy, from the text of
    ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (None: no v1 cpu controller)."""
    path = None
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "cpu" in parts[1].split(","):
            path = parts[2]
    if path is None:
        return None
    for line in mounts.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup" or "cpu" not in tail[2].split(","):
            continue
        root, point = fields[3], fields[4]
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return Path(point) / path[len(root) :].lstrip("/")
    return None


def v1_cpu_parent(setting: str = "") -> tuple[Path | None, str]:
    """(the v1 cpu cgroup under which this process can make capped children, or None; why)."""
    if setting:
        return None, f"PRIMUS_CGROUP={setting}: cgroup v1 CPU quotas off"
    try:
        own = own_v1_cpu_cgroup(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        return None, f"cannot read this process's cgroups: {exc.strerror or exc}"
    if own is None:
        return None, "no cgroup v1 cpu controller for this process"
    if not (own / "cpu.cfs_quota_us").exists() or not os.access(own, os.W_OK):
        return None, f"{own}: no writable cgroup v1 cpu controller (cpu.cfs_quota_us)"
    return own, f"cgroup v1 cpu quota under {own}"


class CpuQuota:
    """A child v1 cpu cgroup whose quota is ``cpu`` cores; ``add`` moves a process (and its threads) in."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, parent: Path, name: str, cpu: float) -> CpuQuota:
        group = cls(parent / re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120])
        group.path.mkdir(exist_ok=True)
        period_file = group.path / "cpu.cfs_period_us"
        period = int(period_file.read_text()) if period_file.exists() else DEFAULT_PERIOD_US
        group.write("cpu.cfs_quota_us", str(max(MIN_QUOTA_US, round(cpu * period))))
        return group

    def write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def add(self, pid: int) -> None:
        self.write("cgroup.procs", str(pid))

    def quota_cores(self) -> float:
        period_file = self.path / "cpu.cfs_period_us"
        period = int(period_file.read_text()) if period_file.exists() else DEFAULT_PERIOD_US
        return int((self.path / "cpu.cfs_quota_us").read_text()) / period

    def throttled(self) -> dict[str, int]:
        """The kernel's ``cpu.stat``: periods, throttled periods, throttled time (ns)."""
        try:
            return {k: int(v) for k, v in (line.split() for line in (self.path / "cpu.stat").read_text().splitlines())}
        except (OSError, ValueError):
            return {}

    def remove(self) -> None:
        """rmdir (the kernel refuses while processes remain)."""
        try:
            self.path.rmdir()
        except OSError as exc:
            log.debug("cgroup %s left in place: %s", self.path, exc)
