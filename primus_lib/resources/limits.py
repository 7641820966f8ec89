"""Executor limits on the local backend: a CPU allotment becomes a thread count, a memory allotment a cap.

The allotment is the vertical policy's latest decision (``primus_lib.allocation.role_resources``).
A batch data task runs inside ``enforced(limits, name)``: Arrow's CPU and I/O pools and the OpenMP /
BLAS / torch threads set to ``ceil(cpu)``, memory capped at ``limits.memory`` above what the process
held when the block began, children started before it excluded (``MemoryCapExceeded`` naming the
task; killed past ``MEMORY_HARD_FACTOR`` x the cap). The supervisor starts a worker with
``thread_env``, ``pin_cores`` and its ``Cgroup`` (``cgroup.py``). Memory: cgroup v2 where this
process's cgroup can give a child the memory controller, else an RSS guard (not ``RLIMIT_AS``:
Python and Arrow reserve far more address space than they touch). ``PRIMUS_CGROUP=off`` disables
cgroups, ``=DIR`` names this process's own.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from primus_lib.resources import proctree
from primus_lib.resources.cgroup import Cgroup, cgroup_parent
from primus_lib.settings import swap_environ

log = logging.getLogger("primus.resources.limits")

MEMORY_HARD_FACTOR = 1.25  # the cap fails the task cleanly; past this multiple the process is killed
GUARD_POLL_SECONDS = 0.05
CHILDREN_EVERY_POLLS = 20  # child processes are listed once a second (a /proc walk)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ARROW_IO_THREADS", "POLARS_MAX_THREADS")


@dataclass(frozen=True)
class Limits:
    """One worker's allotment: cores (fractional) and memory (bytes)."""

    cpu: float
    memory: float

    @property
    def threads(self) -> int:
        return max(1, math.ceil(self.cpu - 1e-9))

    @classmethod
    def for_role(cls, job, role: str) -> Limits | None:
        """The role's current allotment (latest vertical decision, else the spec); None without the role."""
        from primus_lib.allocation import role_resources

        if role not in job.spec.resources.roles:
            return None
        return cls(*role_resources(job, role))


class MemoryCapExceeded(MemoryError):
    """A block under ``enforced`` allocated more than its memory cap."""


class _CapSignal(MemoryCapExceeded):
    """Raised asynchronously in a watched thread by the guard; ``enforced`` turns it into the message."""

    def __str__(self) -> str:
        return "executor memory cap exceeded"


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def cap_message(name: str, cap: float, used: float, rss: float) -> str:
    return (
        f"{name}: executor memory cap {mib(cap)} exceeded (RSS {mib(used)} above the {mib(rss - used)} "
        f"the process held at the start; process RSS {mib(rss)})"
    )


def thread_env(threads: int) -> dict[str, str]:
    """Environment for a new process: Arrow (its CPU pool reads OMP_NUM_THREADS), OpenMP, BLAS, torch."""
    return dict.fromkeys(THREAD_ENV, str(max(1, int(threads))))


def pin_cores(pid: int, cpu: float, index: int = 0) -> set[int]:
    """Pin ``pid`` to ``ceil(cpu)`` of this process's cores, spread by worker index; {} if not possible."""
    available = sorted(os.sched_getaffinity(0))
    cores = min(max(1, math.ceil(cpu - 1e-9)), len(available))
    start = (index * cores) % len(available)
    chosen = {available[(start + k) % len(available)] for k in range(cores)}
    try:
        os.sched_setaffinity(pid, chosen)
    except OSError:
        return set()
    return chosen


# -- the RSS guard ----------------------------------------------------------------------------
def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the kernel's peak RSS (VmHWM) := the RSS now
        return True
    except OSError:
        return False


def _own_peak() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:", 1)[1].split()[0]) * 1024 if "VmHWM:" in status else 0


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class _Guard:
    """Polls this process's RSS; over the cap it raises in the watched threads, over the hard cap it kills."""

    def __init__(self, cap: float) -> None:
        self.cap, self.hard = cap, cap * MEMORY_HARD_FACTOR
        self.pid = os.getpid()
        self.peak_ok = _reset_peak()
        self.elders = set(proctree.descendants(self.pid))  # older children: not the task's
        self.base = proctree.rss(self.pid)
        self.watched: dict[int, str] = {}
        self.signalled: dict[int, tuple[float, float]] = {}  # thread -> (used, rss) when told
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="primus-memory-guard", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        polls, children = 0, 0
        while not self.stop.wait(GUARD_POLL_SECONDS):
            try:
                if polls % CHILDREN_EVERY_POLLS == 0:
                    children = sum(
                        proctree.rss(pid) for pid in proctree.descendants(self.pid) if pid not in self.elders
                    )
                polls += 1
                own = proctree.rss(self.pid)
                if self.peak_ok:
                    own = max(own, _own_peak())
                    _reset_peak()
            except OSError:
                continue
            rss = own + children
            used = rss - self.base
            if used > self.hard:
                self._kill(used, rss)
            elif used > self.cap:
                self._trip(used, rss)

    def _trip(self, used: float, rss: float) -> None:
        with self.lock:
            for thread_id, name in self.watched.items():
                if thread_id not in self.signalled:
                    self.signalled[thread_id] = (used, rss)
                    log.error("%s", cap_message(name, self.cap, used, rss))
                    _raise_in(thread_id, _CapSignal)

    def _kill(self, used: float, rss: float) -> None:
        names = ", ".join(self.watched.values()) or "executor"
        message = f"{cap_message(names, self.hard, used, rss)}: hard cap ({MEMORY_HARD_FACTOR:g} x the cap), killed"
        log.critical("%s", message)
        os.write(2, (message + "\n").encode())
        os.kill(os.getpid(), signal.SIGKILL)

    @contextmanager
    def watching(self, name: str) -> Iterator[None]:
        """Run the block under the cap; past it: MemoryCapExceeded (even if the block caught the signal)."""
        thread_id = threading.get_ident()
        with self.lock:
            self.watched[thread_id] = name
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:  # the guard's _CapSignal, or anything else
            error = exc
        finally:
            told = self._leave(thread_id)
        if told is None and not isinstance(error, _CapSignal):
            if error is not None:
                raise error
            return
        used, rss = told or (0.0, 0.0)
        cause = None if isinstance(error, _CapSignal) else error
        raise MemoryCapExceeded(cap_message(name, self.cap, used, rss)) from cause

    def _leave(self, thread_id: int) -> tuple[float, float] | None:
        """Stop watching this thread; a signal the guard sent that has not landed yet is withdrawn."""
        while True:
            try:
                with self.lock:
                    self.watched.pop(thread_id, None)
                    told = self.signalled.pop(thread_id, None)
                    if told is not None:
                        _raise_in(thread_id, None)
                    return told
            except _CapSignal:  # landed just now, before the lock: withdraw and return it
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


# -- enforcement in this process ------------------------------------------------------------
@dataclass
class Enforcement:
    """What ``enforced`` applied to this process."""

    limits: Limits
    threads: int
    memory: str  # "cgroup v2" (+ the guard) | "rss guard"
    note: str  # which cgroup, or why none
    cgroup: Cgroup | None
    guard: _Guard
    _saved: dict = field(repr=False)


_lock = threading.Lock()
_depth = 0
_active: Enforcement | None = None


def active() -> Enforcement | None:
    """The enforcement in force in this process, if any."""
    return _active


@contextmanager
def enforced(limits: Limits, name: str, *, watch: bool = True) -> Iterator[Enforcement]:
    """Run a block under ``limits``: thread counts set, memory capped; everything restored after.

    Process-wide: nested or concurrent blocks join the outermost one (its limits stay in force);
    each ``watch``ed block fails with MemoryCapExceeded naming ``name`` when the cap is passed.
    A runner that hosts several tasks (BatchExecutor) holds it with ``watch=False``."""
    global _depth, _active
    with _lock:
        current = _active  # None exactly while _depth == 0: the outermost block applies the limits
        if current is None:
            current = _active = _apply(limits, name)
        _depth += 1
    try:
        if watch:
            with current.guard.watching(name):
                yield current
        else:
            yield current
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _active = None
                _restore(current)


def _apply(limits: Limits, name: str) -> Enforcement:
    import pyarrow as pa

    threads = limits.threads
    torch = sys.modules.get("torch")
    saved = {"cpu": pa.cpu_count(), "io": pa.io_thread_count(), "torch": torch.get_num_threads() if torch else None}
    pa.set_cpu_count(threads)
    pa.set_io_thread_count(threads)
    saved["env"] = swap_environ(thread_env(threads))  # for the task's children and lazily started libraries
    if torch is not None:
        torch.set_num_threads(threads)
    parent, note = cgroup_parent()
    group = None
    if parent is not None:
        try:
            group = Cgroup.make(
                parent,
                f"primus-{os.getpid()}-{name}",
                cpu=limits.cpu,
                memory_high=limits.memory,
                memory_max=limits.memory * MEMORY_HARD_FACTOR,
            )
            group.add(os.getpid())
            note = f"cgroup {group.path}"
        except OSError as exc:
            note = f"cgroup v2 under {parent} failed: {exc.strerror or exc}"
            if group is not None:
                group.remove()
            group = None
    saved["parent"] = parent
    enforcement = Enforcement(
        limits, threads, "cgroup v2" if group else "rss guard", note, group, _Guard(limits.memory), saved
    )
    log.info(
        "%s: %d thread(s) for %g cores, memory cap %s by %s (%s)",
        name,
        threads,
        limits.cpu,
        mib(limits.memory),
        enforcement.memory,
        note,
    )
    return enforcement


def _restore(enforcement: Enforcement) -> None:
    import pyarrow as pa

    enforcement.guard.close()
    saved = enforcement._saved
    if enforcement.cgroup is not None:
        try:
            (saved["parent"] / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as exc:
            log.warning("could not leave cgroup %s: %s", enforcement.cgroup.path, exc)
        enforcement.cgroup.remove()
    pa.set_cpu_count(saved["cpu"])
    pa.set_io_thread_count(saved["io"])
    swap_environ(saved["env"])
    torch = sys.modules.get("torch")
    if torch is not None and saved["torch"] is not None:
        torch.set_num_threads(saved["torch"])
