"""The PrimusJob custom resource: one declarative object for a whole training job."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from primus_lib.spec.airflow import AirflowSpec
from primus_lib.spec.base import SpecModel
from primus_lib.spec.dataset import DatasetSpec, StreamSpec
from primus_lib.spec.resources import ResourcesSpec
from primus_lib.spec.scaling import ScalingSpec
from primus_lib.spec.timer import TimerSpec
from primus_lib.spec.training import FeaturesSpec, ModelSpec, TrainingSpec

API_VERSION = "primus.dev/v1alpha1"
KIND = "PrimusJob"


class Metadata(SpecModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", description="DNS-1123 label.")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


DATABASE_SCHEMES = ("postgresql", "postgresql+psycopg2")
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&]*")


def mask_database_url(url: str) -> str:
    """``url`` with its password (user info after ``:``, or a ``password=`` query parameter) as ***;
    robust to passwords that were not percent-encoded (the last ``@`` ends the user info)."""
    head, sep, rest = url.partition("://")
    if not sep:
        return _QUERY_PASSWORD.sub(r"\1***", url)
    auth, at, host = rest.rpartition("@")
    if at and ":" in auth:
        rest = auth.split(":", 1)[0] + ":***@" + host
    return head + sep + _QUERY_PASSWORD.sub(r"\1***", rest)


class MaskedURL(str):
    """A database URL that never shows its password in a repr (spec errors print reprs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(mask_database_url(str(self)))


def _database_url(value: object) -> object:
    if isinstance(value, str):  # empty (e.g. ${PRIMUS_DATABASE:-}): the SQLite default
        return MaskedURL(value.strip()) if value.strip() else None
    return value


def _postgres_only(url: str | None) -> str | None:
    if url is not None and url.partition("://")[0] not in DATABASE_SCHEMES:
        raise ValueError("a postgresql:// or postgresql+psycopg2:// URL (USER:PASSWORD@HOST:PORT/DATABASE)")
    return url


# the masking wrapper runs first, so a refused URL is reported with its password masked
DatabaseUrl = Annotated[str | None, AfterValidator(_postgres_only), BeforeValidator(_database_url)]


STORAGE_SCHEMES = ("file", "s3", "webhdfs")


def _storage_root(root: str | None) -> str | None:
    """A local path, ``file://``, ``s3://BUCKET[/PREFIX]`` or ``webhdfs://[HOST:PORT]/PATH``."""
    if root is None or "://" not in root:
        return root
    scheme, _, rest = root.partition("://")
    if scheme.lower() == "hdfs":
        raise ValueError(
            "a local path, s3://BUCKET/PREFIX or webhdfs://NAMENODE:HTTP_PORT/PATH "
            "(hdfs:// needs a JVM and libhdfs: reach the same cluster over WebHDFS)"
        )
    if scheme.lower() not in STORAGE_SCHEMES:
        raise ValueError("a local path, file://PATH, s3://BUCKET/PREFIX or webhdfs://NAMENODE:HTTP_PORT/PATH")
    if scheme.lower() == "s3" and not rest.split("/", 1)[0]:
        raise ValueError("s3://BUCKET/PREFIX with a bucket")
    return root


class StorageSpec(SpecModel):
    """Where the job keeps its ledger, committed shards and checkpoints."""

    root: Annotated[str | None, AfterValidator(_storage_root)] = Field(
        None,
        description="Where the jobs keep committed windows, checkpoints and metric snapshots (the "
        "job's name is appended): a local path, s3://BUCKET/PREFIX (endpoint and credentials from "
        "connection_id) or webhdfs://NAMENODE:HTTP_PORT/PATH; default $PRIMUS_HOME/jobs, or "
        ".primus/jobs. With a remote root the rest of the job's state stays under $PRIMUS_HOME/jobs.",
    )
    connection_id: str | None = Field(
        None,
        description="Connection (aws/s3 or webhdfs) holding a remote root's endpoint and credentials: an Airflow "
        "connection in Airflow's tasks, the secret file $PRIMUS_SECRETS_DIR/<id>.json in a role's process. "
        "Default: the connection primus_storage_default when there is one, else the SDK's defaults.",
    )
    database: DatabaseUrl = Field(
        None,
        description="SQLAlchemy URL of a PostgreSQL database for the task ledger and the training "
        "queue (postgresql+psycopg2://USER:${PASSWORD_VAR}@HOST:5432/DB); shared by every role. "
        "Default: SQLite, ledger.sqlite under the job's storage root (one machine only).",
        json_schema_extra={"pattern": r"^(postgresql|postgresql\+psycopg2)://|^\s*$"},
    )
    database_connection_id: str | None = Field(
        None,
        description="Connection (postgres) whose login and password complete the database URL, resolved as "
        "connection_id is (instead of a ${PASSWORD_VAR} in the URL).",
    )

    def __repr_args__(self) -> Iterator[tuple[str | None, object]]:  # no password in reprs (logs)
        for name, value in super().__repr_args__():
            yield name, MaskedURL(value) if name == "database" and value is not None else value


class JobSpec(SpecModel):
    timer: TimerSpec
    dataset: DatasetSpec
    features: FeaturesSpec
    model: ModelSpec = ModelSpec()
    training: TrainingSpec = TrainingSpec()
    resources: ResourcesSpec
    scaling: ScalingSpec = ScalingSpec()
    storage: StorageSpec = StorageSpec()
    airflow: AirflowSpec = AirflowSpec()


class PrimusJob(SpecModel):
    apiVersion: Literal["primus.dev/v1alpha1"]
    kind: Literal["PrimusJob"]
    metadata: Metadata
    spec: JobSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def trainer_gpus(self) -> int:
        """GPUs per trainer replica (0 without a trainer role: the checks report that one)."""
        trainer = self.spec.resources.roles.get("trainer")
        return trainer.gpu if trainer is not None else 0

    def stream(self, name: str) -> StreamSpec:
        for stream in self.spec.dataset.streams:
            if stream.name == name:
                return stream
        raise KeyError(f"no stream named {name!r} in job {self.name!r}")

    def connection_ids(self) -> dict[str, str]:
        """Every connection the spec names -> the field that names it first."""
        named: dict[str, str] = {}
        storage = self.spec.storage
        for conn_id, where in [
            (storage.connection_id, "spec.storage.connection_id"),
            (storage.database_connection_id, "spec.storage.database_connection_id"),
        ]:
            if conn_id:
                named.setdefault(conn_id, where)
        for stream in self.spec.dataset.streams:
            for source in stream.sources:
                base = f"spec.dataset.streams[{stream.name}].sources[{source.name}]"
                if source.connection_id:
                    named.setdefault(source.connection_id, f"{base}.connection_id")
                if source.kafka is not None and source.kafka.connection_id:
                    named.setdefault(source.kafka.connection_id, f"{base}.kafka.connection_id")
        return named

    @property
    def batch_streams(self) -> list[StreamSpec]:
        return [s for s in self.spec.dataset.streams if s.kind == "batch"]

    @property
    def stream_streams(self) -> list[StreamSpec]:
        return [s for s in self.spec.dataset.streams if s.kind == "stream"]
