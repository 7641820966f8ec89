"""Stream executor discovery on Kubernetes: the ready addresses of the executors' headless Service;
their credential is the job's Secret mounted into the pod (``names.FLIGHT_TOKEN_FILE``)."""

from __future__ import annotations

import os
from pathlib import Path

from primus_lib.resources.discovery import ExecutorDiscovery, TokenFile
from primus_lib.settings import settings
from primus_lib.spec.job import PrimusJob

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _ordinal(name: str | None) -> int | None:
    tail = (name or "").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


class KubernetesDiscovery(ExecutorDiscovery):
    """Index -> ``grpc://<pod IP>:<flight port>`` from the headless Service's Endpoints (ready only)."""

    def __init__(self, service: str, namespace: str, api_client=None, port_name: str = "flight"):
        self.service, self.namespace, self.port_name = service, namespace, port_name
        self._api_client = api_client  # made on first use: an executor pod (no token) never needs one
        from primus_lib.resources.kubernetes.names import FLIGHT_TOKEN_FILE

        self.token = TokenFile(Path(FLIGHT_TOKEN_FILE), create=False)  # the Secret, mounted by the pod template

    @classmethod
    def for_job(cls, job: PrimusJob, stream: str) -> KubernetesDiscovery:
        """The job's executors serve every stream on one port: ``stream`` does not change the Service."""
        from primus_lib.resources.kubernetes.names import FLIGHT_PORT_NAME, executor_service_name

        namespace = settings().kube_namespace or ""
        if not namespace and os.path.exists(SA_NAMESPACE_FILE):  # in a pod: its own namespace
            namespace = Path(SA_NAMESPACE_FILE).read_text().strip()
        namespace = namespace or job.metadata.namespace or job.spec.resources.namespace
        return cls(executor_service_name(job), namespace, port_name=FLIGHT_PORT_NAME)

    def describe(self) -> str:
        return f"the ready Endpoints of Service {self.service} in namespace {self.namespace}"

    def _core(self):
        from kubernetes import client

        if self._api_client is None:
            from primus_lib.resources.kubernetes.cluster import api_client_for

            self._api_client = api_client_for()  # in-cluster, else the kubeconfig the client finds
        return client.CoreV1Api(self._api_client)

    def locations(self) -> dict[int, str]:
        from kubernetes.client.rest import ApiException

        try:
            endpoints = self._core().read_namespaced_endpoints(self.service, self.namespace)
        except ApiException as exc:
            if exc.status == 404:  # the Service is not there (yet): no executor serves
                return {}
            raise
        out: dict[int, str] = {}
        for subset in endpoints.subsets or []:
            named = {p.name: p.port for p in subset.ports or []}
            port = named.get(self.port_name) or (next(iter(named.values())) if len(named) == 1 else None)
            if port is None:
                continue
            for address in subset.addresses or []:  # ready ones; not_ready_addresses are skipped
                ref = address.target_ref.name if address.target_ref is not None else None
                index = _ordinal(address.hostname) if address.hostname else _ordinal(ref)
                if index is not None:
                    out[index] = f"grpc://{address.ip}:{port}"
        return dict(sorted(out.items()))
