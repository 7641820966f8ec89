"""Apache Kafka 4.x in KRaft mode: one process that is broker and controller, for the demo and tests.

The jars come from Maven Central (`make infra`: scripts/fetch-kafka.sh, infra/kafka/pom.xml) into
``$CACHE/jars/kafka-<version>``. ``KafkaServer`` writes ``server.properties`` and a log4j2 config
into its directory, formats ``<dir>/data`` with the storage tool (a random cluster id; an already
formatted dir is kept), runs ``java -cp "<jars>/*" kafka.Kafka server.properties`` with PLAINTEXT
and CONTROLLER listeners on loopback ports, waits until the broker answers a metadata request,
and stops it by PID (SIGTERM: Kafka's clean shutdown; SIGKILL if that hangs). ``restart()``
starts it again on the same ports and data.

The command line runs one broker in the foreground until SIGTERM/SIGINT::

    python -m devstack.kafka run --port 19092 --controller-port 19093 --dir DIR [--cache DIR]

It prints one line when the broker is ready; a missing fetch or a busy port is one line on
stderr and exit 2.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from devstack.proc import free_port, port_free, port_open, start, stop

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "infra" / "kafka" / "pom.xml"
FETCH_HINT = "run `make infra` or scripts/fetch-kafka.sh"
HOST = "127.0.0.1"
# A small heap; serial GC and the C1 compiler only start faster on 2 cores (~1 s of ~5) and use
# less memory; a development broker never runs hot enough for C2 to pay off.
JVM_OPTS = ["-Xmx512m", "-Xms256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
"""


class KafkaUnavailable(RuntimeError):
    """The jars or the JVM needed to run Kafka are missing (the message names the fix)."""


class PortInUse(RuntimeError):
    """A port the broker must listen on is taken."""


def default_cache() -> Path:
    """Where `make infra` puts the jars: $PRIMUS_CACHE, else ~/.cache/primus (the Makefile's CACHE)."""
    return Path(os.environ.get("PRIMUS_CACHE") or Path.home() / ".cache" / "primus")


def kafka_version() -> str:
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if not found:
        raise KafkaUnavailable(f"{POM}: no <kafka.version>")
    return found.group(1)


def kafka_classpath(cache: Path | None = None) -> str:
    """The classpath of the fetched jars; raises KafkaUnavailable without them or without `java`."""
    version = kafka_version()
    jars = (cache or default_cache()) / "jars" / f"kafka-{version}"
    if not (jars / ".complete").exists() or not (jars / f"kafka_2.13-{version}.jar").exists():
        raise KafkaUnavailable(f"Apache Kafka {version} jars not in {jars}: {FETCH_HINT}")
    if shutil.which("java") is None:
        raise KafkaUnavailable(f"`java` (17+) not on PATH, needed to run Apache Kafka {version}")
    return f"{jars}/*"


def random_cluster_id() -> str:
    """What `kafka-storage.sh random-uuid` prints: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def server_properties(data: Path, port: int, controller_port: int, host: str = HOST) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": 1,
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data,
        "num.partitions": 1,
        "default.replication.factor": 1,
        "min.insync.replicas": 1,
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 1,  # created on the first group commit: keep it quick
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "log.retention.check.interval.ms": 3_600_000,
        "log.retention.ms": -1,  # replays carry past event times (datagen): time retention would drop them
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launcher dies, even by SIGKILL (Linux only)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class KafkaServer:
    """One KRaft node (broker + controller) in ``root``: formatted once, startable again.

    ``port``/``controller_port`` default to free loopback ports; given ones must be free
    (PortInUse names the one that is not).
    """

    def __init__(
        self,
        root: Path,
        classpath: str,
        port: int | None = None,
        controller_port: int | None = None,
        die_with_parent: bool = False,
    ):
        self.root, self.classpath = Path(root), classpath
        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        for name, wanted in (("port", port), ("controller port", controller_port)):
            if wanted is not None and not port_free(wanted, HOST):
                raise PortInUse(f"{HOST}:{wanted} (the Kafka {name}) is already in use")
        self.port = port if port is not None else free_port()
        self.controller_port = controller_port if controller_port is not None else free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        self.data = self.root / "data"
        self.config = self.root / "server.properties"
        self.config.write_text(server_properties(self.data, self.port, self.controller_port))
        self.log = self.root / "kafka.log"  # the broker's own log (log4j2)
        self.stdout = self.root / "kafka.stdout.log"  # JVM output (crashes before logging starts)
        (self.root / "log4j2.properties").write_text(LOG4J2.format(log=self.log))
        self.proc: subprocess.Popen | None = None
        if not (self.data / "meta.properties").exists():
            self._format()

    def _format(self) -> None:
        fmt = self._command(
            "kafka.tools.StorageTool", "format", f"--cluster-id={random_cluster_id()}", "-c", str(self.config)
        )
        done = subprocess.run(fmt, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"formatting {self.data} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def _command(self, main: str, *args: str) -> list[str]:
        log4j = f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}"
        return ["java", *JVM_OPTS, log4j, "-cp", self.classpath, main, *args]

    def ready(self) -> bool:
        """The broker answers a metadata request and lists itself (not just an open port)."""
        if not port_open(self.port, HOST):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 2000})
        return 1 in admin.list_topics(timeout=2).brokers

    def start(self, timeout: float = 90.0) -> None:
        preexec = _die_with_parent if self.die_with_parent else None
        self.proc = start(
            self._command("kafka.Kafka", str(self.config)), self.stdout, self.ready, timeout=timeout, preexec_fn=preexec
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, sig=signal.SIGTERM, timeout=30)  # Kafka's shutdown hook: a clean stop
            self.proc = None
        deadline = time.monotonic() + 10  # the ports are ours again before a restart binds them
        while (port_open(self.port, HOST) or port_open(self.controller_port, HOST)) and time.monotonic() < deadline:
            time.sleep(0.1)

    def restart(self, timeout: float = 90.0) -> None:
        """Stop cleanly and start again: same ports, same data."""
        self.stop()
        self.start(timeout)

    def rss_bytes(self) -> int:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", fields).group(1)) * 1024  # type: ignore[union-attr]


class _Interrupted(BaseException):
    """SIGTERM/SIGINT reached the launcher: stop the broker and exit 0."""


def _interrupt(signum: int, _frame) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):  # one stop only: a second signal must not cut it short
        signal.signal(sig, signal.SIG_IGN)
    raise _Interrupted(signum)


def run(port: int, controller_port: int, root: Path, cache: Path | None, timeout: float) -> int:
    """Run one broker in the foreground until SIGTERM/SIGINT; return the exit status."""
    name = "devstack.kafka"
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    server: KafkaServer | None = None
    try:
        try:
            server = KafkaServer(root, kafka_classpath(cache), port, controller_port, die_with_parent=True)
        except (KafkaUnavailable, PortInUse) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        try:
            server.start(timeout)
        except RuntimeError as exc:
            print(f"{name}: Apache Kafka failed to start: {exc}", file=sys.stderr)
            return 1
        print(
            f"{name}: Apache Kafka {kafka_version()} (KRaft) ready on {server.bootstrap} "
            f"(controller {HOST}:{server.controller_port}, dir {server.root}, log {server.log})",
            flush=True,
        )
        while True:
            code = server.proc.poll() if server.proc is not None else 0
            if code is not None:
                tail = server.log.read_text(errors="replace")[-2000:] if server.log.exists() else ""
                print(f"{name}: the broker exited by itself ({code}); log tail:\n{tail}", file=sys.stderr)
                server.proc = None
                return 1
            time.sleep(0.5)
    except _Interrupted:
        return 0
    finally:
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.kafka", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run one KRaft broker in the foreground until SIGTERM/SIGINT")
    run_p.add_argument("--port", type=int, required=True, help=f"the PLAINTEXT listener on {HOST}")
    run_p.add_argument("--controller-port", type=int, required=True, help=f"the CONTROLLER listener on {HOST}")
    run_p.add_argument("--dir", type=Path, required=True, help="config, logs and data (reused when formatted)")
    run_p.add_argument(
        "--cache", type=Path, default=None, help="where the jars are (default: $PRIMUS_CACHE or ~/.cache/primus)"
    )
    run_p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the broker (default 90)")
    args = parser.parse_args(argv)
    if args.port == args.controller_port:
        print(f"devstack.kafka: --port and --controller-port are both {args.port}", file=sys.stderr)
        return 2
    return run(args.port, args.controller_port, args.dir.resolve(), args.cache, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
