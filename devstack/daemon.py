"""Background servers that outlive the command that started them: a pid file per server.

``devstack.proc`` starts servers that die with their parent (tests, the Kafka launcher); the live
stack (``devstack.stack``) must leave them running after ``up`` exits and find them again in a
later ``down``/``status``. Each server runs in its own session (its process group = its pid) and
its pid file holds the pid and the process's start time, so a recycled pid is never mistaken
for ours (and never signalled).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot): with the pid, one process's identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]  # a zombie has ended


class Daemon:
    """One named background server: ``<run_dir>/<name>.pid`` and its log ``<log_dir>/<name>.log``."""

    def __init__(self, name: str, run_dir: Path, log_dir: Path) -> None:
        self.name = name
        self.pidfile = run_dir / f"{name}.pid"
        self.log = log_dir / f"{name}.log"

    def pid(self) -> int | None:
        """Our server's pid while it runs; None (and no pid file) once it has ended."""
        try:
            record = json.loads(self.pidfile.read_text())
        except (OSError, ValueError):
            return None
        pid = int(record.get("pid", 0))
        if pid > 0 and _start_time(pid) == record.get("start"):
            return pid
        self.pidfile.unlink(missing_ok=True)
        return None

    def spawn(self, args: list[str], env: dict[str, str], cwd: Path | None = None, **popen) -> int:
        """Start ``args`` detached (own session, output appended to the log) and record it."""
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as handle:
            handle.write(f"\n== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} starting: {' '.join(args)}\n".encode())
            handle.flush()
            proc = subprocess.Popen(
                args,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
                **popen,
            )
        record = {"pid": proc.pid, "start": _start_time(proc.pid), "args": args}
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.rename(self.pidfile)
        return proc.pid

    def wait_ready(self, ready: Callable[[], bool], timeout: float) -> None:
        """Wait until ``ready()``; raise with the log's tail when the server ends or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise RuntimeError(f"{self.name} exited before it was ready; {self.log} ends with:\n{self.tail()}")
            try:
                if ready():
                    return
            except Exception:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f}s; {self.log} ends with:\n{self.tail()}")

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0, group: bool = True) -> bool:
        """Signal our server (its process group, or only its pid), wait, escalate to SIGKILL on the
        group; True if it was running."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while self.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.pid() is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self.pid() is not None and time.monotonic() < deadline + 10:
                time.sleep(0.1)
        self.pidfile.unlink(missing_ok=True)
        return True
