"""Start and stop a server process: free ports, wait-until-ready, stop by PID (never by name)."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """A server could listen on ``host:port`` now (bound like a JVM server socket: SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def start(
    args: list[str],
    log: Path,
    ready: Callable[[], bool],
    timeout: float = 30.0,
    env: dict | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen:
    """Start ``args`` with output to ``log`` and wait until ``ready()``; raise with the log's tail if not.

    The child gets its own session (a Ctrl-C aimed at the caller does not reach it); whatever
    interrupts the wait (a signal handler's exception included) stops it before propagating.
    """
    handle = open(log, "ab")
    try:
        proc = subprocess.Popen(
            args, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=preexec_fn
        )
    finally:
        handle.close()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if ready():
                    return proc
            except Exception:
                pass
            time.sleep(0.1)
    except BaseException:
        stop(proc)
        raise
    code = proc.poll()
    what = f"exited with {code} before it was ready" if code is not None else f"did not become ready within {timeout}s"
    stop(proc)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"{args[0]} {what}; log tail:\n{tail}")


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 10.0) -> None:
    """Stop the server's process group (our own child's PID only), escalating to SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def wait_for_line(proc: subprocess.Popen, word: str, timeout: float = 60.0) -> str:
    """Read ``proc``'s stdout (a pipe) until a line contains ``word`` and return that line; raise
    with the output's tail when the process ends or ``timeout`` passes first."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        if sel.select(0.2):
            line = proc.stdout.readline().decode()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            if word in line:
                return line
    tail = "".join(seen)[-3000:]
    raise RuntimeError(f"{word!r} not printed (exit {proc.poll()}, {timeout:.0f}s):\n{tail}")


def poll_until(check: Callable[[], object], what: str, timeout: float, poll: float = 1.0) -> object:
    """Call ``check`` until it returns something truthy (an exception counts as not yet: a server
    still starting) and return that; ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except Exception:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)
