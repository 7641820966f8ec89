"""What the local supervisor (``supervisor.py``) keeps of each role and each worker: the allotment it
starts them with, their process and state, and how each is confined; ``Worker.row`` is the worker's
line of the process table (``table.json``) that ``local.py`` reads.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import psutil

from primus_lib.resources.cgroup import Cgroup
from primus_lib.resources.cpu_quota import CpuQuota
from primus_lib.resources.table import identity


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen | None = None
    state: str = "pending"  # pending | running | succeeded | failed | stopped
    exit_code: int | None = None
    restarts: int = 0
    oom_kills: int = 0
    rss: int = 0
    cpu_percent: float = 0.0
    cores: list[int] = field(default_factory=list)  # pinned to (the CPU allotment)
    cgroup: str = ""  # its cgroup v2 directory, where the machine allows one
    cpu_quota: str = ""  # its cgroup v1 cpu directory, where v2 caps no CPU and v1 can
    _ps: psutil.Process | None = None
    _group: Cgroup | None = None
    _quota: CpuQuota | None = None

    @property
    def process(self) -> subprocess.Popen:
        """Its process, for the supervisor's steps that follow a successful ``launch``."""
        if self.proc is None:
            raise RuntimeError(f"worker {self.index}: no process (never launched)")
        return self.proc

    def row(self) -> dict:
        ident = identity(self.proc.pid) if self.proc and self.state == "running" and self.proc.poll() is None else {}
        return {
            "index": self.index,
            "state": self.state,
            "exit_code": self.exit_code,
            "restarts": self.restarts,
            "oom_kills": self.oom_kills,
            "rss": self.rss,
            "cpu_percent": self.cpu_percent,
            "cores": self.cores,
            "cgroup": self.cgroup,
            "cpu_quota": self.cpu_quota,
            **ident,
        }


@dataclass
class Role:
    name: str
    command: list[str] | None
    replicas: int
    cpu: float
    memory: float
    max_restarts: int
    critical: bool
    workers: dict[int, Worker] = field(default_factory=dict)
    started: bool = False
    note: str = ""
