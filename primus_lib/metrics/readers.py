"""Where the Dynamic Scaling Manager reads its inputs: a real Prometheus server (production,
and the integration test), the snapshot files executors and trainers write into the job's
metrics dir (the embedded default, ``TextfileReader``) or the in-process prometheus-client
registry. Snapshot files may be local or on the job's shared storage (s3://, webhdfs://)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import requests
from prometheus_client import REGISTRY, CollectorRegistry

from primus_lib.metrics import names as n
from primus_lib.storage import StorageLocation, Where, locate


@dataclass(frozen=True)
class Snapshot:
    """The data executors and trainers of one job at one instant (utilisations are 0..1)."""

    at: float
    executors: int
    buffer: float
    cpu: float
    memory: float
    cpu_cores_max: float
    memory_bytes_max: float
    oom_kills: float
    trainer_starved: float
    trainer_backpressure: float
    stream_lag: float | None = None  # stream executors: rows of their partitions not read yet (None: not reported)
    # stream executors, summed over their last reporting intervals (None: not reported): rows read per
    # second, and rows per second their partitions received (the source's rate)
    read_rate: float | None = None
    source_rate: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def busy_read_rate(self) -> float | None:
        """Rows/s one stream executor reads fully busy, from this interval (None: nothing read or reported)."""
        if not self.read_rate or self.read_rate <= 0 or self.executors <= 0 or self.cpu <= 0:
            return None
        return self.read_rate / (self.executors * self.cpu)


@dataclass(frozen=True)
class UsagePoint:
    at: float
    cpu_cores: float
    memory_bytes: float


class MetricsReader(ABC):
    def __init__(self, job: str, role: str = "data_executor") -> None:
        self.job, self.role = job, role

    @abstractmethod
    def snapshot(self) -> Snapshot | None:
        """The current values, or None when no executor reports yet."""

    def usage_history(self, lookback_seconds: float, step_seconds: float) -> list[UsagePoint] | None:
        """Peak per-executor usage over the look-back window, oldest first; None = not available here."""
        return None


class RegistryReader(MetricsReader):
    """Reads the in-process registry the executors and trainers of the embedded default fill."""

    def __init__(self, job: str, role: str = "data_executor", registry: CollectorRegistry = REGISTRY) -> None:
        super().__init__(job, role)
        self.registry = registry

    def _families(self):
        return self.registry.collect()

    def _values(self, name: str, role: str | None) -> list[float]:
        out: list[float] = []
        for family in self._families():
            for sample in family.samples:
                if sample.name != name or sample.labels.get(n.JOB_LABEL) != self.job:
                    continue
                if role is not None and sample.labels.get(n.ROLE_LABEL) != role:
                    continue
                out.append(float(sample.value))
        return out

    def snapshot(self) -> Snapshot | None:
        buffers = self._values(n.BUFFER_UTILISATION, self.role)
        if not buffers:
            return None
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        top = lambda xs: max(xs) if xs else 0.0  # noqa: E731
        return Snapshot(
            at=time.time(),
            executors=len(buffers),
            buffer=mean(buffers),
            cpu=mean(self._values(n.CPU_UTILISATION, self.role)),
            memory=mean(self._values(n.MEMORY_UTILISATION, self.role)),
            cpu_cores_max=top(self._values(n.CPU_USED_CORES, self.role)),
            memory_bytes_max=top(self._values(n.MEMORY_USED_BYTES, self.role)),
            oom_kills=sum(self._values(n.OOM_KILLS, self.role)),
            trainer_starved=top(self._values(n.TRAINER_STARVED, "trainer")),
            trainer_backpressure=top(self._values(n.TRAINER_BACKPRESSURE, "trainer")),
            stream_lag=_sum_or_none(self._values(n.STREAM_LAG, self.role)),
            read_rate=_sum_or_none(self._values(n.STREAM_READ_RATE, self.role)),
            source_rate=_sum_or_none(self._values(n.STREAM_SOURCE_RATE, self.role)),
        )


def _sum_or_none(values: list[float]) -> float | None:
    return sum(values) if values else None


class TextfileReader(RegistryReader):
    """Reads the metric snapshots processes write with ``write_snapshot`` / ``SnapshotWriter``
    (Prometheus text format, one file per worker under JobPaths(...).metrics_dir): the embedded
    default, where executors and trainers are separate processes and no Prometheus server runs.
    The directory may be local or on the job's shared storage (s3://, webhdfs://: executors and
    trainers on other hosts PUT their snapshots there). Files older than ``stale_seconds`` (a dead
    worker's last words) are ignored."""

    def __init__(self, job: str, directory: Where, role: str = "data_executor", stale_seconds: float = 300.0) -> None:
        super().__init__(job, role)
        self.directory, self.stale_seconds = locate(directory), stale_seconds

    def _families(self):
        from prometheus_client.parser import text_string_to_metric_families

        for text in _fresh_snapshots(self.directory, time.time() - self.stale_seconds):
            yield from text_string_to_metric_families(text)


def has_snapshots(directory: Where) -> bool:
    """Whether ``directory`` (the job's metrics location) holds any ``*.prom`` snapshot."""
    return any(e.name.endswith(".prom") and not e.is_dir for e in locate(directory).list())


def _fresh_snapshots(where: StorageLocation, since: float) -> Iterator[str]:
    """The text of each snapshot modified after ``since``, in name order; one removed between the
    listing and the read is skipped."""
    for entry in where.list():
        if entry.is_dir or not entry.name.endswith(".prom") or (entry.mtime is not None and entry.mtime < since):
            continue
        try:
            yield (where / entry.name).read_text()
        except FileNotFoundError:
            continue


class PrometheusError(RuntimeError):
    """Prometheus refused or failed a query; the message names the server, the query and why."""


@dataclass(frozen=True)
class PrometheusEndpoint:
    """A Prometheus HTTP API and its login: basic auth (``login``/``password``) or a bearer ``token``
    (a server behind ``--web.config.file``, an auth proxy, a hosted service)."""

    url: str
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, url: str | None, login, where: str) -> PrometheusEndpoint:
        """``url``, else the connection's own, with the connection's login (``credentials.HttpLogin``,
        from the connection ``where`` names)."""
        address = url or login.url
        if not address:
            raise ValueError(f"{where}: the connection has no host, and no Prometheus URL was given")
        return cls(address, login.login, login.password, login.token)


class PrometheusReader(MetricsReader):
    """Instant and range queries against a Prometheus server's HTTP API (/api/v1/query[_range])."""

    def __init__(
        self,
        endpoint: str | PrometheusEndpoint,
        job: str,
        role: str = "data_executor",
        timeout: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        super().__init__(job, role)
        endpoint = endpoint if isinstance(endpoint, PrometheusEndpoint) else PrometheusEndpoint(endpoint)
        self.url, self.timeout = endpoint.url.rstrip("/"), timeout
        self.session = session or requests.Session()
        self.logs_in = bool(endpoint.token or endpoint.login)
        if endpoint.token:
            self.session.headers["Authorization"] = f"Bearer {endpoint.token}"
        elif endpoint.login:
            self.session.auth = (endpoint.login, endpoint.password or "")

    def _sel(self, role: str) -> str:
        return f'{{{n.JOB_LABEL}="{self.job}",{n.ROLE_LABEL}="{role}"}}'

    def query(self, promql: str) -> float | None:
        reply = self.session.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=self.timeout)
        data = self._data(reply, promql)
        return float(data["result"][0]["value"][1]) if data["result"] else None

    def _data(self, reply: requests.Response, promql: str) -> dict:
        if reply.status_code in (401, 403):  # the body of a refusal says nothing more
            why = "check the login of its connection" if self.logs_in else "it asks for a login: give its connection"
            raise PrometheusError(f"Prometheus {self.url}: query {promql!r} refused ({reply.status_code}): {why}")
        if reply.status_code != 200:
            raise PrometheusError(
                f"Prometheus {self.url}: query {promql!r} answered {reply.status_code}: {reply.text[:300]}"
            )
        body = reply.json()
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus {self.url}: query {promql!r} failed: {body}")
        return body["data"]

    def snapshot(self) -> Snapshot | None:
        ex, tr = self._sel(self.role), self._sel("trainer")
        count = self.query(f"count({n.BUFFER_UTILISATION}{ex})")
        if not count:
            return None
        value = lambda q: self.query(q) or 0.0  # noqa: E731
        return Snapshot(
            at=time.time(),
            executors=int(count),
            buffer=value(f"avg({n.BUFFER_UTILISATION}{ex})"),
            cpu=value(f"avg({n.CPU_UTILISATION}{ex})"),
            memory=value(f"avg({n.MEMORY_UTILISATION}{ex})"),
            cpu_cores_max=value(f"max({n.CPU_USED_CORES}{ex})"),
            memory_bytes_max=value(f"max({n.MEMORY_USED_BYTES}{ex})"),
            oom_kills=value(f"sum({n.OOM_KILLS}{ex})"),
            trainer_starved=value(f"max({n.TRAINER_STARVED}{tr})"),
            trainer_backpressure=value(f"max({n.TRAINER_BACKPRESSURE}{tr})"),
            stream_lag=self.query(f"sum({n.STREAM_LAG}{ex})"),
            read_rate=self.query(f"sum({n.STREAM_READ_RATE}{ex})"),
            source_rate=self.query(f"sum({n.STREAM_SOURCE_RATE}{ex})"),
        )

    def usage_history(self, lookback_seconds: float, step_seconds: float) -> list[UsagePoint] | None:
        end = time.time()
        ex = self._sel(self.role)
        series = {}
        for key, name in (("cpu", n.CPU_USED_CORES), ("mem", n.MEMORY_USED_BYTES)):
            promql = f"max({name}{ex})"
            params: dict[str, str | float] = {
                "query": promql,
                "start": end - lookback_seconds,
                "end": end,
                "step": max(1.0, step_seconds),
            }
            reply = self.session.get(f"{self.url}/api/v1/query_range", params=params, timeout=self.timeout)
            result = self._data(reply, promql)["result"]
            series[key] = {float(t): float(v) for t, v in result[0]["values"]} if result else {}
        times = sorted(set(series["cpu"]) & set(series["mem"]))
        return [UsagePoint(t, series["cpu"][t], series["mem"][t]) for t in times]
