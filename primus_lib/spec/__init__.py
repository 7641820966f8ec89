"""The PrimusJob spec: pydantic models, YAML loading with ${ENV} expansion, checks, CRD."""

from __future__ import annotations

from primus_lib.spec.airflow import AirflowSpec
from primus_lib.spec.dataset import DatasetSpec, JoinSpec, KafkaSpec, SourceSpec, StreamSpec
from primus_lib.spec.errors import Problem, SpecError
from primus_lib.spec.job import JobSpec, Metadata, PrimusJob
from primus_lib.spec.loader import job_from_document, load_job, parse_job
from primus_lib.spec.resources import ClusterTarget, ResourcesSpec, RoleSpec
from primus_lib.spec.scaling import HorizontalScaling, ScalingSpec, VerticalScaling
from primus_lib.spec.timer import TimerSpec
from primus_lib.spec.training import FeaturesSpec, ModelSpec, SparseFeature, TrainingSpec

__all__ = [
    "AirflowSpec",
    "ClusterTarget",
    "DatasetSpec",
    "FeaturesSpec",
    "HorizontalScaling",
    "JobSpec",
    "JoinSpec",
    "KafkaSpec",
    "Metadata",
    "ModelSpec",
    "PrimusJob",
    "Problem",
    "ResourcesSpec",
    "RoleSpec",
    "ScalingSpec",
    "SourceSpec",
    "SparseFeature",
    "SpecError",
    "StreamSpec",
    "TimerSpec",
    "TrainingSpec",
    "VerticalScaling",
    "job_from_document",
    "load_job",
    "parse_job",
]
