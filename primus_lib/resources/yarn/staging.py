"""The job's connections for its YARN workers, the way Hadoop hands files to containers: staged on the
cluster's HDFS, localized by each NodeManager.

The submitter writes the connections it resolves (``credentials.current().mountable``: Airflow's in
the trainer task, its mounted secret elsewhere) as ``<id>.json`` files (0600) into a fresh directory
(0700) ``<home>/.primus-staging/<job>-<random>`` on the cluster's HDFS, over WebHDFS as the YARN
user (the applications' owner, so the NodeManager's localizer may read them). Each worker's
submission context lists that directory as a LocalResource (visibility APPLICATION: localized for
that application only, removed with it) linked as ``primus-secrets`` in the container's working
directory, and the worker's ``PRIMUS_SECRETS_DIR`` is that relative name (the AM makes it absolute
for the role's command). The RM sees the HDFS path only, never a secret.

One staged copy serves every worker start of a submission (a restarted attempt localizes the same
copy again: YARN checks its modification time); a new submission stages afresh, ``stop()`` removes it.
The cluster's HDFS comes from the RM's own configuration (its /conf servlet, as the scheduler
address does): ``fs.defaultFS``, the URL the NodeManagers read, and ``dfs.namenode.http-address``
(WebHDFS; unserved or a wildcard host: fs.defaultFS's host, Hadoop's default port 9870).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from primus_lib.credentials import CONNECTION_ID, Connection, current
from primus_lib.resources.base import ResourceError
from primus_lib.resources.table import locked, read_json, resources_dir, write_json
from primus_lib.resources.yarn.client import YarnClient
from primus_lib.spec.job import PrimusJob

SECRETS_LINK = "primus-secrets"  # the localized directory's name in the container's working directory
STAGING_DIR = ".primus-staging"  # under the YARN user's HDFS home
WEBHDFS_PORT = 9870
SUBMITTER_ONLY = ("PRIMUS_SECRETS_DIR",)  # a path on the submitting host: never a worker's


@dataclass(frozen=True)
class Staged:
    """One staged copy: where the NodeManagers read it, where we wrote it, and what YARN checks."""

    default_fs: str  # hdfs://NAMENODE:PORT
    webhdfs: str  # http://NAMENODE:HTTP_PORT
    path: str
    size: int
    timestamp: int  # the directory's modification time (ms); a changed copy fails localization

    @property
    def resource(self) -> str:
        return self.default_fs + self.path

    def local_resource(self) -> dict[str, Any]:
        """The submission context's ``local-resources`` entry (Cluster Applications API)."""
        value = {"resource": self.resource, "type": "FILE", "visibility": "APPLICATION"}
        return {"key": SECRETS_LINK, "value": {**value, "size": self.size, "timestamp": self.timestamp}}


def worker_environment(caller: Mapping[str, str], prefixes: tuple[str, ...], staged: Staged | None) -> dict[str, str]:
    """The caller's variables a worker gets (those with ``prefixes``, never its secrets directory),
    and ``PRIMUS_SECRETS_DIR`` naming the localized connections when there are any."""
    env = {k: v for k, v in caller.items() if k.startswith(prefixes) and k not in SUBMITTER_ONLY}
    return {**env, "PRIMUS_SECRETS_DIR": SECRETS_LINK} if staged else env


def hdfs_addresses(default_fs: str | None, http_address: str | None) -> tuple[str, str]:
    """(hdfs://NAMENODE:PORT, http://NAMENODE:HTTP_PORT) from the cluster's fs.defaultFS and
    dfs.namenode.http-address."""
    split = urlsplit(default_fs or "")
    if split.scheme != "hdfs" or not split.hostname:
        raise ResourceError(
            f"the cluster's fs.defaultFS (from the RM's /conf): expected hdfs://NAMENODE:PORT, where the job's "
            f"connections are staged for the NodeManagers, found {default_fs or 'nothing'}"
        )
    host, _, port = (http_address or f"0.0.0.0:{WEBHDFS_PORT}").rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = split.hostname
    return f"hdfs://{split.netloc}", f"http://{host}:{port or WEBHDFS_PORT}"


class Staging:
    """The staging area of one cluster's HDFS, over WebHDFS as ``user``."""

    def __init__(self, default_fs: str, webhdfs: str, user: str) -> None:
        from fsspec.implementations.webhdfs import WebHDFS

        split = urlsplit(webhdfs)
        self.default_fs, self.webhdfs, self.user = default_fs, webhdfs, user
        self.fs = WebHDFS(split.hostname, port=split.port or WEBHDFS_PORT, user=user)

    def stage(self, job: str, connections: Iterable[Connection]) -> Staged:
        path = f"{self.fs.home_directory().rstrip('/')}/{STAGING_DIR}/{job}-{secrets.token_hex(8)}"
        self.fs.mkdir(path)
        try:
            self.fs.chmod(path, "700")  # before any file is in it
            for conn in connections:
                if not CONNECTION_ID.fullmatch(conn.conn_id):
                    raise ResourceError(f"connection id {conn.conn_id!r}: expected letters, digits, '_', '-' or '.'")
                name = f"{path}/{conn.conn_id}.json"
                self.fs.pipe_file(name, conn.as_json().encode())
                self.fs.chmod(name, "600")
            status = self.fs.info(path)  # after the last file: its creation changed the directory
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                self.remove(path)
            raise
        return Staged(self.default_fs, self.webhdfs, path, int(status["length"]), int(status["modificationTime"]))

    def unchanged(self, staged: Staged) -> bool:
        """True when the staged copy is there as it was staged (what the NodeManagers check)."""
        try:
            return int(self.fs.info(staged.path)["modificationTime"]) == staged.timestamp
        except FileNotFoundError:
            return False

    def remove(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass


class JobSecrets:
    """A job's staged connections on one YARN cluster, recorded in ``resources/yarn-secrets.json``
    (per RM: the HDFS path and what YARN checks, never a secret) for whichever process starts
    workers next."""

    def __init__(self, job: PrimusJob, client: YarnClient) -> None:
        self.job, self.client = job, client

    @property
    def _file(self):
        return resources_dir(self.job) / "yarn-secrets.json"

    def _staging(self, staged: Staged | None = None) -> Staging:
        if staged is not None:
            return Staging(staged.default_fs, staged.webhdfs, self.client.user)
        addresses = hdfs_addresses(self.client.conf("fs.defaultFS"), self.client.conf("dfs.namenode.http-address"))
        return Staging(*addresses, self.client.user)

    def _recorded(self) -> Staged | None:
        found = read_json(self._file, {}).get(self.client.url)
        return Staged(**found) if found else None

    def _record(self, staged: Staged | None) -> None:
        record = read_json(self._file, {})
        record.pop(self.client.url, None)
        write_json(self._file, {**record, **({self.client.url: asdict(staged)} if staged else {})})

    def for_worker(self) -> Staged | None:
        """The submission's staged copy; staged now when there is none (or it is gone): the
        connections this process resolves. None when it resolves none (the SDKs' defaults)."""
        with locked(resources_dir(self.job)):
            staged = self._recorded()
            try:
                if staged is not None and self._staging(staged).unchanged(staged):
                    return staged
                found = current().mountable(self.job.connection_ids())
                if staged is None and not found:
                    return None
                if staged is not None:
                    self._staging(staged).remove(staged.path)
                fresh = self._staging().stage(self.job.name, found) if found else None
            except ResourceError:
                raise
            except (OSError, RuntimeError, ValueError) as exc:  # what fsspec's WebHDFS and requests raise
                raise ResourceError(f"job {self.job.name!r}: staging its connections on HDFS: {exc}") from exc
            self._record(fresh)
            return fresh

    def discard(self) -> None:
        """Remove the staged copy (the job stopped, or a new submission stages afresh)."""
        with locked(resources_dir(self.job)):
            staged = self._recorded()
            if staged is None:
                return
            try:
                self._staging(staged).remove(staged.path)
            except (OSError, RuntimeError, ValueError) as exc:
                raise ResourceError(f"job {self.job.name!r}: removing {staged.resource}: {exc}") from exc
            self._record(None)
