"""The ApplicationMaster of one Primus worker: registers with the ResourceManager, runs the role's
command as its child and heartbeats until the child exits.

Run by the NodeManager as the AM container's command:
    python -m primus_lib.resources.yarn.am --scheduler HOST:PORT (--command BASE64 | -- COMMAND [ARGS...])
(``--command``: base64 JSON, see ipc.encode_command: the launch script holds no quote of the role's).

- child exits 0: unregister SUCCEEDED, exit 0 (the application FINISHED/SUCCEEDED);
- child fails (or is killed): exit with its code WITHOUT unregistering, so the RM counts a failed
  attempt and starts the next one (YARN's AM retry is the worker's restart);
- the RM says AM_SHUTDOWN, or the NodeManager sends SIGTERM (application killed): stop the child.
The child stays in the container's process group (the NodeManager signals the group) and gets
PR_SET_PDEATHSIG=SIGKILL, so a kill -9 of this process never leaves the role's command running.
The scheduler address (host:port) is an argument the backend writes; the AMRMToken is in the
container's token file (YARN's $HADOOP_TOKEN_FILE_LOCATION, read through primus_lib.settings).
A relative $PRIMUS_SECRETS_DIR (the job's connections, a LocalResource: staging.py) is made
absolute against the container's working directory for the command.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time

from primus_lib.resources.yarn.ipc import (
    AM_RESYNC,
    AM_SHUTDOWN,
    AMRM_TOKEN_KIND,
    AMRMClient,
    IpcError,
    decode_command,
    read_tokens,
)
from primus_lib.settings import child_environment, settings

HEARTBEAT_SECONDS = 1.0
RECONNECT_SECONDS = 60.0
STOP_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1


def log(message: str) -> None:
    print(f"primus-am: {message}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def scheduler_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"primus-am: --scheduler must be host:port, found {value!r}")
    return host, int(port)


def amrm_token():
    path = settings().hadoop_token_file
    if not path:
        raise SystemExit("primus-am: HADOOP_TOKEN_FILE_LOCATION is not set (not run as a YARN AM container?)")
    with open(path, "rb") as handle:
        tokens = read_tokens(handle.read())
    for token in tokens:
        if token.kind == AMRM_TOKEN_KIND:
            return token
    raise SystemExit(f"primus-am: no {AMRM_TOKEN_KIND} in {path} (found {[t.kind for t in tokens]})")


def command_environment() -> dict[str, str]:
    """The container's environment for the role's command, a relative ``PRIMUS_SECRETS_DIR`` (the
    job's connections, localized into the container's working directory) made absolute: the command
    may change its directory."""
    secrets = settings().secrets_dir
    if secrets is None or secrets.is_absolute():
        return child_environment()
    return child_environment(PRIMUS_SECRETS_DIR=str(secrets.absolute()))


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Master:
    def __init__(self, command: list[str], scheduler: str) -> None:
        self.command = command
        self.client = AMRMClient(scheduler_address(scheduler), amrm_token())
        self.child: subprocess.Popen | None = None
        self.stopping = False

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            try:
                self.child.send_signal(signum)
            except ProcessLookupError:
                pass

    def stop_child(self) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        self.child.terminate()
        try:
            self.child.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait(5)

    def heartbeat(self) -> int | None:
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                command = self.client.heartbeat()
            except IpcError as exc:
                if "ApplicationMasterNotRegistered" in exc.exception_class:
                    return AM_RESYNC
                if exc.exception_class or time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            else:
                return command
            time.sleep(1.0)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        host = socket.gethostname()
        self.client.register(host)
        log(f"registered with the RM at {self.client.address[0]}:{self.client.address[1]}; running {self.command}")
        self.child = subprocess.Popen(self.command, preexec_fn=_die_with_parent, env=command_environment())
        while True:
            code = self.child.poll()
            if code is not None:
                break
            if self.stopping:
                self.stop_child()
                return 143
            command = self.heartbeat()
            if command == AM_SHUTDOWN:
                log("the RM asked this AM to shut down")
                self.stop_child()
                return 1
            if command == AM_RESYNC:  # the RM restarted and forgot us: register again
                log("the RM asked for a resync: registering again")
                self.client.register(host)
            try:  # until the next heartbeat, or at once when the command exits
                self.child.wait(HEARTBEAT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        if code != 0:
            log(f"the command exited {code}: failing this attempt (the RM starts the next one if any remain)")
            return exit_code(code)
        deadline = time.monotonic() + 30
        while not self.client.finish("SUCCEEDED", "the command exited 0") and time.monotonic() < deadline:
            time.sleep(0.2)
        log("the command exited 0: unregistered as SUCCEEDED")
        return 0


def parse_args(argv: list[str]) -> tuple[str, list[str]]:
    """(scheduler address, the role's command) from ``--scheduler H:P (--command B64 | -- CMD...)``."""
    scheduler, command = "", []
    while argv:
        head, argv = argv[0], argv[1:]
        if head == "--":
            command = argv
            break
        if head in ("--scheduler", "--command") and argv:
            value, argv = argv[0], argv[1:]
            scheduler, command = (value, command) if head == "--scheduler" else (scheduler, decode_command(value))
        else:
            raise SystemExit(f"primus-am: unexpected argument {head!r}")
    return scheduler, command


def main(argv: list[str]) -> int:
    scheduler, command = parse_args(argv)
    if not command or not scheduler:
        print(
            "usage: python -m primus_lib.resources.yarn.am --scheduler HOST:PORT (--command BASE64 | -- COMMAND...)",
            file=sys.stderr,
        )
        return 2
    try:
        return Master(command, scheduler).run()
    except (IpcError, OSError) as exc:
        log(f"cannot talk to the ResourceManager: {exc}")
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
