"""The ResourceManager (and NodeManager) REST calls the YARN backend needs, and the
application-submission-context it sends (Hadoop 3 Cluster Applications API, /ws/v1/cluster)."""

from __future__ import annotations

import getpass
import math
import re
import shlex
from urllib.parse import urlsplit

import requests

from primus_lib.resources.base import ResourceError
from primus_lib.resources.yarn.ipc import encode_command

APP_TYPE = "PRIMUS"
LIVE_STATES = ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING")
MIB = 2**20
AM_MODULE = "primus_lib.resources.yarn.am"
DEFAULT_SCHEDULER_PORT = 8030
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# what a shell interprets between double quotes, and YARN's {{VAR}} (the NodeManager makes it $VAR)
_LAUNCH_SCRIPT_SYNTAX = re.compile(r'["\\$`\x00-\x1f\x7f]|\{\{|\}\}')


class YarnClient:
    """A client of one ResourceManager's REST API (``url`` = http://HOST:PORT of the RM web app).

    ``user`` is sent as ``user.name`` (Hadoop's pseudo authentication, which an RM with simple
    auth and no anonymous access requires for writes): the cluster's ``user`` in the spec, else the OS user."""

    def __init__(
        self, url: str, session: requests.Session | None = None, timeout: float = 30.0, user: str | None = None
    ) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.user = user or getpass.getuser()
        self.session = session or requests.Session()
        self._conf: dict[str, str | None] = {}

    def _request(self, method: str, url: str, what: str, **kwargs) -> requests.Response:
        params = kwargs.pop("params", {}) or {}
        if self.user:
            params["user.name"] = self.user
        try:
            reply = self.session.request(
                method, url, params=params, timeout=self.timeout, headers={"Accept": "application/json"}, **kwargs
            )
        except requests.RequestException as exc:
            raise ResourceError(f"YARN {what}: {method} {url} failed: {exc}") from exc
        if reply.status_code >= 400:
            raise ResourceError(f"YARN {what}: {method} {url} answered {reply.status_code}: {reply.text[:300]}")
        return reply

    def _call(self, method: str, path: str, **kwargs) -> dict:
        reply = self._request(method, f"{self.url}/ws/v1/cluster{path}", f"RM {self.url}", **kwargs)
        try:
            return reply.json() if reply.content else {}
        except ValueError:  # some calls (container signals) answer with no JSON body
            return {}

    # -- applications ---------------------------------------------------------------------------
    def new_application(self) -> dict:
        """{"application-id": ..., "maximum-resource-capability": {"memory": MB, "vCores": n}}."""
        return self._call("POST", "/apps/new-application")

    def submit(self, context: dict) -> None:
        self._call("POST", "/apps", json=context)

    def apps(self, tag: str) -> list[dict]:
        """Applications of type PRIMUS carrying ``tag`` (the RM matches ANY of several tags, so one)."""
        body = self._call("GET", "/apps", params={"applicationTags": tag, "applicationTypes": APP_TYPE})
        return ((body.get("apps") or {}).get("app")) or []

    def app(self, app_id: str) -> dict:
        return self._call("GET", f"/apps/{app_id}")["app"]

    def attempts(self, app_id: str) -> list[dict]:
        body = self._call("GET", f"/apps/{app_id}/appattempts")
        return ((body.get("appAttempts") or {}).get("appAttempt")) or []

    def attempt_containers(self, app_id: str, attempt_id: str) -> list[dict]:
        body = self._call("GET", f"/apps/{app_id}/appattempts/{attempt_id}/containers")
        found = body.get("container") or (body.get("containers") or {}).get("container") or []
        return found if isinstance(found, list) else [found]

    def kill(self, app_id: str) -> None:
        self._call("PUT", f"/apps/{app_id}/state", json={"state": "KILLED"})

    def signal_container(self, container_id: str, command: str = "FORCEFUL_SHUTDOWN") -> None:
        """OUTPUT_THREAD_DUMP | GRACEFUL_SHUTDOWN (SIGTERM) | FORCEFUL_SHUTDOWN (SIGKILL)."""
        self._call("POST", f"/containers/{container_id}/signal/{command}")

    def metrics(self) -> dict:
        return self._call("GET", "/metrics")["clusterMetrics"]

    def node_container(self, node_http_address: str, container_id: str) -> dict:
        """The NodeManager's view of a container (state, totalMemoryNeededMB, totalVCoresNeeded)."""
        base = node_http_address if "://" in node_http_address else f"http://{node_http_address}"
        reply = self._request("GET", f"{base}/ws/v1/node/containers/{container_id}", f"NM {base}")
        return reply.json()["container"]

    # -- configuration --------------------------------------------------------------------------
    def conf(self, name: str) -> str | None:
        """One value of the RM's configuration from its /conf servlet, or None where it is not served."""
        if name not in self._conf:
            try:
                reply = self.session.get(
                    f"{self.url}/conf",
                    params={"name": name},
                    timeout=self.timeout,
                    headers={"Accept": "application/json"},
                )
                prop = reply.json().get("property") if reply.ok else None
                self._conf[name] = prop.get("value") if isinstance(prop, dict) else None
            except (requests.RequestException, ValueError):
                self._conf[name] = None
        return self._conf[name]

    def scheduler_address(self) -> str:
        """host:port of the RM's ApplicationMasterService (yarn.resourcemanager.scheduler.address), where
        the AM registers; a wildcard or missing host becomes the RM web app's host."""
        rm_host = urlsplit(self.url).hostname or "127.0.0.1"
        value = self.conf("yarn.resourcemanager.scheduler.address") or f"{rm_host}:{DEFAULT_SCHEDULER_PORT}"
        host, _, port = value.rpartition(":")
        if host in ("", "0.0.0.0", "::"):
            host = rm_host
        return f"{host}:{port}"


def submission_context(
    app_id: str,
    name: str,
    command: list[str],
    cpu: float,
    memory: float,
    queue: str,
    tags: list[str],
    env: dict[str, str],
    attempts: int,
    python: str,
    scheduler: str = "",
    local_resources: list[dict] | None = None,
) -> dict:
    """The application-submission-context (Cluster Applications API): the AM container runs our AM
    (primus_lib.resources.yarn.am) with the RM's scheduler address and ``command`` (base64: no quote
    reaches the launch script) as arguments; it registers with the RM and runs ``command`` as its child.
    ``local_resources``: ``{"key": NAME, "value": {...}}`` entries the NodeManager localizes first."""
    where = f" --scheduler {shlex.quote(scheduler)}" if scheduler else ""
    am = (
        f"{shlex.quote(python)} -m {AM_MODULE}{where} --command {encode_command(command)} "
        "1><LOG_DIR>/stdout 2><LOG_DIR>/stderr"
    )
    check_launch_script(env, am)
    return {
        "application-id": app_id,
        "application-name": name,
        "application-type": APP_TYPE,
        "queue": queue,
        "am-container-spec": {
            "commands": {"command": am},
            "environment": {"entry": [{"key": k, "value": v} for k, v in sorted(env.items())]},
            **({"local-resources": {"entry": local_resources}} if local_resources else {}),
        },
        "resource": {"memory": int(math.ceil(memory / MIB)), "vCores": max(1, int(math.ceil(cpu)))},
        "max-app-attempts": attempts,
        "keep-containers-across-application-attempts": False,
        "unmanaged-AM": False,
        "application-tags": {"tag": tags},
    }


def check_launch_script(env: dict[str, str], command: str) -> None:
    """The NodeManager writes the container's launch script with each variable as ``export KEY="VALUE"``
    and the command as ``exec /bin/bash -c "COMMAND"``, unescaped, after turning ``{{`` into ``$``: a
    ``"``, ``\\``, ``$``, backquote, ``{{``, ``}}`` or control character there would be shell code.
    Refused (whichever way a Hadoop version writes the script, what is left means the same), naming
    the variable but not showing its value (it may be a secret). The role's own command travels
    base64-encoded (the AM's ``--command``); the AM's interpreter path is shlex-quoted."""
    for key, value in [*env.items(), ("(the AM command)", command)]:
        if key in env and not ENV_NAME.fullmatch(key):
            raise ResourceError(f"YARN container environment: expected a variable name, found {key!r}")
        found = _LAUNCH_SCRIPT_SYNTAX.search(value)
        if found:
            raise ResourceError(
                f"YARN container launch script, {key}: expected no '\"', '\\', '$', '`', '{{{{', '}}}}' or control "
                f"characters (the NodeManager's shell would interpret them), found {found.group()!r} at character "
                f"{found.start()}"
            )
