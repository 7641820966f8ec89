"""A FAKE HTTP layer for unit tests where a real server is too heavy: a requests transport adapter
that records every request and answers from a handler. Tests using it check request construction,
not a server's behaviour; each real server has its own integration tests (docs/status.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import requests
from requests.adapters import BaseAdapter


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: object
    headers: dict[str, str]


@dataclass
class FakeHTTP(BaseAdapter):
    handler: Callable[[Recorded], tuple[int, object]]
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def send(self, request, **kwargs):
        url = urlsplit(request.url)
        body = json.loads(request.body) if request.body else None
        rec = Recorded(request.method, url.path, parse_qs(url.query), body, dict(request.headers))
        self.requests.append(rec)
        status, payload = self.handler(rec)
        response = requests.Response()
        response.status_code = status
        response._content = json.dumps(payload).encode() if payload is not None else b""
        response.headers["Content-Type"] = "application/json"
        response.url, response.request = request.url, request
        return response

    def close(self) -> None:
        pass

    def session(self) -> requests.Session:
        s = requests.Session()
        s.mount("http://", self)
        s.mount("https://", self)
        return s
