"""The job's credential for its stream executors' Arrow Flight service: one bearer token per job.

Every Flight call to an executor (``DoGet``, every action, the listings) carries the header
``authorization: Bearer <token>``; a server middleware refuses any call without the job's token
(``FlightUnauthenticatedError``), comparing in constant time. The token is a file, never an
argument or an environment variable, so it shows in no ``ps`` and no log:

- beside the executors' registry (``primus_lib.resources.discovery``, ``ExecutorDiscovery.token``):
  the job's local root (``resources/executors/.flight-token``, mode 0600) or its shared state
  (``executors/.flight-token`` on S3/HDFS: YARN and remote roots), made there by the first executor
  or trainer that needs it (``secrets.token_urlsafe``); whoever can list the executors can read it;
- on Kubernetes, the Secret ``<job>-flight`` (key ``token``) the controller creates with the job
  and mounts into the executor and trainer pods (``kubernetes/names.FLIGHT_TOKEN_FILE``; never made there).

Two processes making a remote token at once (S3 has no create-if-absent): the last PUT wins. A
server whose token does not match re-reads the file (at most every ``REFRESH_SECONDS``) before it
refuses; a client refused re-reads it before its next try. So both settle on the stored token.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING

import pyarrow.flight as flight

from primus_lib.storage import StorageLocation, Where, locate

if TYPE_CHECKING:
    from primus_lib.resources.discovery import ExecutorDiscovery

HEADER, SCHEME = "authorization", "Bearer "
REFRESH_SECONDS = 2.0
MIN_LENGTH = 16
log = logging.getLogger(__name__)


class Credential:
    """The token stored at ``where`` (a local path or a shared-storage location), read once and
    kept; made there on first use unless ``create`` is False (a mounted Secret)."""

    def __init__(self, where: Where, create: bool = True):
        self.where, self.create = locate(where), create
        self._token: str | None = None
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def token(self, fresh: bool = False) -> str:
        """The job's token (read again from its file when ``fresh``)."""
        with self._lock:
            if self._token is None or fresh:
                self._token, self._read_at = self._load(), time.monotonic()
            return self._token

    def accepts(self, presented: str | None) -> bool:
        """Whether ``presented`` is the job's token (constant-time); a mismatch re-reads the file first
        when the last read is ``REFRESH_SECONDS`` old (another process's PUT may have won)."""
        if not presented:
            return False
        if _same(presented, self.token()):
            return True
        return time.monotonic() - self._read_at >= REFRESH_SECONDS and _same(presented, self.token(fresh=True))

    def _load(self) -> str:
        text = _read(self.where)
        if text is None:
            if not self.create:
                raise FileNotFoundError(f"no Flight token at {self.where}: the pod lacks the job's Secret")
            self.where.put_if_absent(secrets.token_urlsafe(32).encode())  # another's, made first, stands
            text = _read(self.where) or ""
        token = text.strip()
        if len(token) < MIN_LENGTH:
            raise ValueError(f"{self.where}: the Flight token is shorter than {MIN_LENGTH} characters")
        return token


def credential_for(discovery: ExecutorDiscovery) -> Credential | None:
    """The credential of the executors ``discovery`` finds (None: a bare list, no token)."""
    token = discovery.token
    return None if token is None else Credential(token.where, token.create)


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _read(where: StorageLocation) -> str | None:
    try:
        return where.read_text()
    except FileNotFoundError:
        return None


def call_headers(token: str | None) -> list[tuple[bytes, bytes]]:
    """The headers a client sends with every call (none without a token)."""
    return [] if token is None else [(HEADER.encode(), (SCHEME + token).encode())]


class TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call that lacks the job's token (before the method runs)."""

    def __init__(self, credential: Credential):
        super().__init__()
        self.credential = credential
        self.refused = 0
        self._logged = float("-inf")

    def start_call(self, info, headers):
        values = headers.get(HEADER) or []
        presented = values[0] if len(values) == 1 and isinstance(values[0], str) else ""
        if presented.startswith(SCHEME) and self.credential.accepts(presented[len(SCHEME) :]):
            return None
        self.refused += 1
        if time.monotonic() - self._logged >= 10.0:  # a flood of refused calls logs one line per 10 s
            self._logged = time.monotonic()
            log.warning("refused a Flight %s call without the job's token (%d so far)", info.method, self.refused)
        raise flight.FlightUnauthenticatedError("this stream executor serves only its job: the job's token is required")
