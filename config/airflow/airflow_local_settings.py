"""Airflow cluster policies of Primus: put this folder on the scheduler's PYTHONPATH (or copy the
file to $AIRFLOW_HOME/config/); see docs/resources.md, "Vertical scaling on Kubernetes"."""

from primus_operators.policies import pod_mutation_hook

__all__ = ["pod_mutation_hook"]
