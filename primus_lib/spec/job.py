"""The PrimusJob custom resource: one declarative object for a whole training job."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

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


class StorageSpec(SpecModel):
    """Where the job keeps its ledger, committed shards and checkpoints."""

    root: str | None = Field(
        None,
        description="URI of the jobs' working storage (the job's name is appended); "
        "default $PRIMUS_HOME/jobs, or .primus/jobs.",
    )


class JobSpec(SpecModel):
    timer: TimerSpec
    dataset: DatasetSpec
    features: FeaturesSpec
    model: ModelSpec
    training: TrainingSpec = TrainingSpec()
    resources: ResourcesSpec
    scaling: ScalingSpec = ScalingSpec()
    storage: StorageSpec = StorageSpec()


class PrimusJob(SpecModel):
    apiVersion: Literal["primus.dev/v1alpha1"]
    kind: Literal["PrimusJob"]
    metadata: Metadata
    spec: JobSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    def stream(self, name: str) -> StreamSpec:
        for stream in self.spec.dataset.streams:
            if stream.name == name:
                return stream
        raise KeyError(f"no stream named {name!r} in job {self.name!r}")

    @property
    def batch_streams(self) -> list[StreamSpec]:
        return [s for s in self.spec.dataset.streams if s.kind == "batch"]

    @property
    def stream_streams(self) -> list[StreamSpec]:
        return [s for s in self.spec.dataset.streams if s.kind == "stream"]
