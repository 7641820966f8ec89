"""Kubernetes client settings (kubeconfig, context, namespace) from an Airflow connection."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


class PrimusKubernetesHook(BaseHook):
    """Reads the cncf.kubernetes provider's connection fields (``kube_config_path``,
    ``cluster_context``, ``namespace``, ``in_cluster``) so one connection serves both.
    """

    conn_name_attr = "kubernetes_conn_id"
    default_conn_name = "kubernetes_default"
    conn_type = "kubernetes"
    hook_name = "Primus Kubernetes"

    def __init__(self, kubernetes_conn_id: str = default_conn_name):
        super().__init__()
        self.kubernetes_conn_id = kubernetes_conn_id

    def settings(self) -> dict[str, Any]:
        return kubernetes_settings(self.get_connection(self.kubernetes_conn_id).extra_dejson)


def kubernetes_settings(extra: dict[str, Any]) -> dict[str, Any]:
    def field(name: str) -> Any:
        return extra.get(name, extra.get(f"extra__kubernetes__{name}"))

    return {
        "kubeconfig": field("kube_config_path"),
        "context": field("cluster_context"),
        "namespace": field("namespace"),
        "in_cluster": str(field("in_cluster")).lower() == "true",
    }
