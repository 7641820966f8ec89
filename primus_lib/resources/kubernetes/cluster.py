"""Connecting to one Kubernetes cluster and asking what it supports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from primus_lib.resources.kubernetes.names import INDEXED_JOB_MIN, PYTORCHJOB

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


def api_client_for(kubeconfig: str | None = None, context: str | None = None):
    """An ApiClient from a kubeconfig file/context, else in-cluster config, else ~/.kube/config."""
    from kubernetes import config

    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config()
            from kubernetes import client

            return client.ApiClient()
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig, context=context)


@dataclass
class Cluster:
    """One API server, its namespace, and what it can do (server version, Kubeflow CRD)."""

    api: ApiClient
    namespace: str = "default"
    name: str = "default"

    @cached_property
    def version(self) -> tuple[int, int]:
        from kubernetes import client

        info = client.VersionApi(self.api).get_code()
        return int(re.sub(r"\D", "", info.major)), int(re.sub(r"\D", "", info.minor))

    @property
    def indexed_jobs(self) -> bool:
        return self.version >= INDEXED_JOB_MIN

    @cached_property
    def has_pytorchjob(self) -> bool:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        group, version, plural = PYTORCHJOB
        try:
            resources = client.CustomObjectsApi(self.api).get_api_resources(group, version)
        except ApiException:
            return False
        return any(r.name == plural for r in resources.resources)

    @property
    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def apps(self):
        from kubernetes import client

        return client.AppsV1Api(self.api)

    @property
    def batch(self):
        from kubernetes import client

        return client.BatchV1Api(self.api)

    @property
    def networking(self):
        from kubernetes import client

        return client.NetworkingV1Api(self.api)

    @property
    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api)
