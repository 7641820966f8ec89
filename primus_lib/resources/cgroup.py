"""cgroup v2 for the local backend: the cgroup this process may make children under, and a child
cgroup with a memory (and CPU) limit.

A worker (``supervisor.py``) or a data task (``limits.enforced``) in its own cgroup is capped by the
kernel, not only by the RSS guard of ``limits.py``; where there is none (no v2 hierarchy, no memory
controller to delegate, ``PRIMUS_CGROUP=off``) the reason is kept for the log. cgroup v1 CPU quotas
are ``cpu_quota.py``'s.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

from primus_lib.settings import settings

log = logging.getLogger("primus.resources.limits")

CPU_PERIOD_US = 100_000
CGROUP_ENV = "PRIMUS_CGROUP"


def cgroup_parent() -> tuple[Path | None, str]:
    """(the cgroup under which this process can make children with a memory limit, or None; why)."""
    return _cgroup_parent(settings().cgroup or "")


@functools.lru_cache(maxsize=8)
def _cgroup_parent(setting: str) -> tuple[Path | None, str]:
    if setting.lower() in ("off", "0", "false", "no", "none"):
        return None, f"disabled by {CGROUP_ENV}={setting}"
    own = Path(setting) if setting else _own_cgroup()
    if own is None:
        return None, "no cgroup v2 hierarchy for this process (/proc/self/cgroup, /proc/self/mountinfo)"
    try:
        controllers = (own / "cgroup.controllers").read_text().split()
        subtree = (own / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return None, f"{own}: {exc.strerror or exc}"
    if "memory" not in controllers:
        return None, f"{own}: no memory controller on cgroup v2 (cgroup.controllers: {' '.join(controllers) or '-'})"
    missing = [c for c in ("memory", "cpu") if c in controllers and c not in subtree]
    if missing:
        try:
            (own / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
        except OSError as exc:
            return None, f"{own}: cannot enable {'/'.join(missing)} for child cgroups ({exc.strerror or exc})"
    return own, f"cgroup v2 under {own}"


def _own_cgroup() -> Path | None:
    try:
        membership = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in membership if line.startswith("0::")), None)
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if path is None or right.split()[:1] != ["cgroup2"] or len(fields) < 5:
            continue
        root, point = fields[3], fields[4]
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return Path(point) / path[len(root) :].lstrip("/")
    return None


class Cgroup:
    """A child cgroup with a memory (and CPU) limit; ``add`` moves a process into it."""

    def __init__(self, path: Path) -> None:
        self.path, self.ooms_before = path, 0

    @classmethod
    def make(
        cls, parent: Path, name: str, *, cpu: float, memory_max: float, memory_high: float | None = None
    ) -> Cgroup:
        group = cls(parent / re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120])
        group.path.mkdir(exist_ok=True)
        if memory_high is not None:
            group.write("memory.high", str(int(memory_high)))
        group.write("memory.max", str(int(memory_max)))
        if "cpu" in (parent / "cgroup.subtree_control").read_text().split():
            group.write("cpu.max", f"{max(1000, int(cpu * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        group.ooms_before = group.oom_kills()  # a cgroup left from before keeps its count
        return group

    def write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def add(self, pid: int) -> None:
        self.write("cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        try:
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines() if line)
        except (OSError, ValueError):
            return 0
        return int(events.get("oom_kill", 0))

    def remove(self) -> None:
        """rmdir (the kernel refuses while processes remain; the charges move to the parent)."""
        try:
            self.path.rmdir()
        except OSError as exc:
            log.debug("cgroup %s left in place: %s", self.path, exc)
