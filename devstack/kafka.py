"""Apache Kafka 4.x in KRaft mode: one process that is broker and controller, for the demo and tests.

The jars come from Maven Central (`make infra`: scripts/fetch-kafka.sh, infra/kafka/pom.xml) into
``$CACHE/jars/kafka-<version>``. ``KafkaServer`` writes ``server.properties`` and a log4j2 config
into its directory, formats ``<dir>/data`` with the storage tool (a random cluster id; an already
formatted dir is kept), runs ``java -cp "<jars>/*" kafka.Kafka server.properties`` on loopback
ports, waits until the broker answers a metadata request, and stops it by PID (SIGTERM: Kafka's
clean shutdown; SIGKILL if that hangs). ``restart()`` starts it again on the same ports and data.

Every listener asks for a login (a ``Login``): clients and the broker itself on the CLIENT
listener with SCRAM-SHA-256 (the user is added to the metadata when the dir is formatted), the
KRaft CONTROLLER listener with PLAIN (KRaft cannot keep SCRAM users for its own quorum). The
password reaches Kafka in ``server.properties`` (mode 0600) and in an argument file the storage
tool reads (``java @file``, deleted at once), never in a command line.

The command line runs one broker in the foreground until SIGTERM/SIGINT::

    PRIMUS_KAFKA_PASSWORD=... python -m devstack.kafka run --port 19092 --controller-port 19093 \
        --dir DIR [--user admin] [--cache DIR]

It prints one line when the broker is ready; a missing fetch, a busy port, a missing password or
a dir formatted for another login is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from devstack.private import write_private
from devstack.proc import free_port, port_free, port_open, start, stop

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "infra" / "kafka" / "pom.xml"
FETCH_HINT = "run `make infra` or scripts/fetch-kafka.sh"
HOST = "127.0.0.1"
PASSWORD_ENV = "PRIMUS_KAFKA_PASSWORD"
CONN_ID = "primus_kafka"  # the connection the demo spec's Kafka source names
MECHANISM = "SCRAM-SHA-256"
# Characters the login may not hold: they would need escaping in server.properties, in JAAS and in
# the storage tool's ``[name=..,password=..]``; a refusal is clearer than three escape rules.
UNSAFE = re.compile(r'[\s"\\,\[\]=]')
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


class LoginMismatch(RuntimeError):
    """The data dir was formatted without this login (or for another one)."""


@dataclass(frozen=True)
class Login:
    """The one user of a development broker: the broker's own login and every client's."""

    user: str
    password: str

    def __post_init__(self) -> None:
        for name, value in (("user", self.user), ("password", self.password)):
            if not value or UNSAFE.search(value):
                raise ValueError(f"Kafka {name}: expected a non-empty value without whitespace or any of '\"\\,[]='")

    def __repr__(self) -> str:
        return f"Login(user={self.user!r}, password=***)"

    def client_config(self, bootstrap: str) -> dict[str, str]:
        """librdkafka settings of a client of this broker."""
        return {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECHANISM,
            "sasl.username": self.user,
            "sasl.password": self.password,
        }

    def connection(self, bootstrap: str) -> dict:
        """The broker as an Airflow connection (what ``primus_lib.credentials.kafka_config`` reads)."""
        host, _, port = bootstrap.rpartition(":")
        extra = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM}
        return {
            "conn_type": "primus_kafka",  # the plugin's PrimusKafkaHook
            "host": host,
            "port": int(port),
            "login": self.user,
            "password": self.password,
            "extra": extra,
        }

    def fingerprint(self) -> str:
        """What the data dir was formatted for (kept beside server.properties, 0600)."""
        return hashlib.sha256(f"{self.user}\0{self.password}".encode()).hexdigest()


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


def server_properties(data: Path, port: int, controller_port: int, login: Login, host: str = HOST) -> str:
    user, password = login.user, login.password
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    settings = {
        "process.roles": "broker,controller",
        "node.id": 1,
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"CLIENT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"CLIENT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "CLIENT",
        "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.client.sasl.enabled.mechanisms": MECHANISM,
        "listener.name.client.scram-sha-256.sasl.jaas.config": (
            f'{scram} required username="{user}" password="{password}";'
        ),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": (
            f'{plain} required username="{user}" password="{password}" user_{user}="{password}";'
        ),
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


def write_connection(directory: Path, connection: dict, conn_id: str = CONN_ID) -> Path:
    """``<directory>/<conn_id>.json``, readable by its owner only: a broker's login as a role process
    finds it under ``$PRIMUS_SECRETS_DIR`` (written as the local backend mounts its roles' secrets)."""
    from primus_lib.credentials import Connection, write_secret_files

    write_secret_files(directory, [Connection(conn_id, **connection)])
    return directory / f"{conn_id}.json"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launcher dies, even by SIGKILL (Linux only)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class KafkaServer:
    """One KRaft node (broker + controller) in ``root``: formatted once, startable again.

    ``port``/``controller_port`` default to free loopback ports; given ones must be free
    (PortInUse names the one that is not). A dir formatted for another ``login`` (or before
    brokers asked for one) raises LoginMismatch naming what to remove.
    """

    def __init__(
        self,
        root: Path,
        classpath: str,
        login: Login,
        port: int | None = None,
        controller_port: int | None = None,
        die_with_parent: bool = False,
    ):
        self.root, self.classpath, self.login = Path(root), classpath, login
        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        for name, wanted in (("port", port), ("controller port", controller_port)):
            if wanted is not None and not port_free(wanted, HOST):
                raise PortInUse(f"{HOST}:{wanted} (the Kafka {name}) is already in use")
        self.port = port if port is not None else free_port()
        self.controller_port = controller_port if controller_port is not None else free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data = self.root / "data"
        self.formatted_for = self.root / "login.sha256"
        if (self.data / "meta.properties").exists():
            self._check_login()
        self.config = self.root / "server.properties"
        write_private(self.config, server_properties(self.data, self.port, self.controller_port, login))
        self.log = self.root / "kafka.log"  # the broker's own log (log4j2)
        self.stdout = self.root / "kafka.stdout.log"  # JVM output (crashes before logging starts)
        (self.root / "log4j2.properties").write_text(LOG4J2.format(log=self.log))
        self.proc: subprocess.Popen | None = None
        if not (self.data / "meta.properties").exists():
            self._format()

    def _check_login(self) -> None:
        found = self.formatted_for.read_text().strip() if self.formatted_for.exists() else None
        if found != self.login.fingerprint():
            why = "another login" if found else "a broker without a login"
            raise LoginMismatch(f"{self.data} was formatted for {why}: remove it to start a fresh broker")

    def _format(self) -> None:
        scram = f"{MECHANISM}=[name={self.login.user},password={self.login.password}]"
        arguments = self.root / "format.args"  # `java @file`: the password stays out of the command line
        write_private(
            arguments,
            f'kafka.tools.StorageTool\nformat\n--cluster-id={random_cluster_id()}\n-c\n"{self.config}"\n--add-scram\n"{scram}"\n',
        )
        try:
            done = subprocess.run([*self._command(), f"@{arguments}"], capture_output=True, text=True, timeout=120)
        finally:
            arguments.unlink(missing_ok=True)
        if done.returncode != 0:
            raise RuntimeError(f"formatting {self.data} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        write_private(self.formatted_for, self.login.fingerprint() + "\n")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def client_config(self) -> dict[str, str]:
        """librdkafka settings of a client of this broker (its address and the login)."""
        return self.login.client_config(self.bootstrap)

    def write_connection(self, directory: Path, conn_id: str = CONN_ID) -> Path:
        """This broker's login as the secret file ``<directory>/<conn_id>.json``."""
        return write_connection(directory, self.login.connection(self.bootstrap), conn_id)

    def _command(self, *main_and_args: str) -> list[str]:
        log4j = f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}"
        return ["java", *JVM_OPTS, log4j, "-cp", self.classpath, *main_and_args]

    def ready(self) -> bool:
        """The broker answers a metadata request and lists itself (not just an open port)."""
        if not port_open(self.port, HOST):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({**self.client_config(), "socket.connection.setup.timeout.ms": "2000"})
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


def mounted_server(root: Path, classpath: str, user: str = "primus") -> KafkaServer:
    """A broker (not started) with a fresh random login, that login mounted as ``root/secrets/
    primus_kafka.json`` and ``$PRIMUS_SECRETS_DIR`` of this process (and its children) pointed
    there: a bench's own broker, reached by its roles as a deployed job's roles reach theirs."""
    server = KafkaServer(root / "kafka", classpath, Login(user, secrets.token_urlsafe(18)))
    os.environ["PRIMUS_SECRETS_DIR"] = str(server.write_connection(root / "secrets").parent)
    return server


class _Interrupted(BaseException):
    """SIGTERM/SIGINT reached the launcher: stop the broker and exit 0."""


def _interrupt(signum: int, _frame) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):  # one stop only: a second signal must not cut it short
        signal.signal(sig, signal.SIG_IGN)
    raise _Interrupted(signum)


def run(port: int, controller_port: int, root: Path, login: Login, cache: Path | None, timeout: float) -> int:
    """Run one broker in the foreground until SIGTERM/SIGINT; return the exit status."""
    name = "devstack.kafka"
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    server: KafkaServer | None = None
    try:
        try:
            server = KafkaServer(root, kafka_classpath(cache), login, port, controller_port, die_with_parent=True)
        except (KafkaUnavailable, PortInUse, LoginMismatch) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        try:
            server.start(timeout)
        except RuntimeError as exc:
            print(f"{name}: Apache Kafka failed to start: {exc}", file=sys.stderr)
            return 1
        print(
            f"{name}: Apache Kafka {kafka_version()} (KRaft) ready on {server.bootstrap} "
            f"(SASL {MECHANISM}, user {login.user}; controller {HOST}:{server.controller_port}, "
            f"dir {server.root}, log {server.log})",
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
    run_p.add_argument("--port", type=int, required=True, help=f"the CLIENT listener on {HOST} (SASL {MECHANISM})")
    run_p.add_argument("--controller-port", type=int, required=True, help=f"the CONTROLLER listener on {HOST}")
    run_p.add_argument("--user", default="admin", help=f"the login's user (default admin; password: ${PASSWORD_ENV})")
    run_p.add_argument("--dir", type=Path, required=True, help="config, logs and data (reused when formatted)")
    run_p.add_argument(
        "--cache", type=Path, default=None, help="where the jars are (default: $PRIMUS_CACHE or ~/.cache/primus)"
    )
    run_p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the broker (default 90)")
    args = parser.parse_args(argv)
    if args.port == args.controller_port:
        print(f"devstack.kafka: --port and --controller-port are both {args.port}", file=sys.stderr)
        return 2
    password = os.environ.get(PASSWORD_ENV, "")
    try:
        login = Login(args.user, password)
    except ValueError as exc:
        why = f"set ${PASSWORD_ENV} (the login's password; never a flag)" if not password else str(exc)
        print(f"devstack.kafka: {why}", file=sys.stderr)
        return 2
    return run(args.port, args.controller_port, args.dir.resolve(), login, args.cache, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
