"""The WebHDFS client path. No Hadoop cluster exists here: these tests run the real fsspec
WebHDFS client against a FAKE, protocol-level WebHDFS REST server (GETFILESTATUS, LISTSTATUS,
OPEN) backed by a local directory, and against a closed port. Not a test of a real NameNode."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from primus_lib.data.dtgg import Planner
from primus_lib.data.executor import run_window
from tests.data.helpers import T0, job_doc, make_job, write_layout


def _status(path: Path, name: str = "") -> dict:
    kind = "DIRECTORY" if path.is_dir() else "FILE"
    return {"pathSuffix": name, "type": kind, "length": 0 if path.is_dir() else path.stat().st_size,
            "modificationTime": int(path.stat().st_mtime * 1000), "permission": "755", "owner": "u", "group": "g",
            "accessTime": 0, "blockSize": 134217728, "replication": 1}  # fmt: skip


def fake_webhdfs(root: Path) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            local = root / unquote(parts.path.removeprefix("/webhdfs/v1")).lstrip("/")
            if not local.exists():
                return self._json(
                    404,
                    {
                        "RemoteException": {
                            "exception": "FileNotFoundException",
                            "message": f"File does not exist: {parts.path}",
                        }
                    },
                )
            op = query.get("op", "").upper()
            if op == "GETFILESTATUS":
                return self._json(200, {"FileStatus": _status(local)})
            if op == "LISTSTATUS":
                entries = [_status(p, p.name) for p in sorted(local.iterdir())]
                return self._json(200, {"FileStatuses": {"FileStatus": entries}})
            if op == "OPEN":
                data = local.read_bytes()
                offset = int(query.get("offset", 0))
                length = int(query.get("length", len(data) - offset))
                chunk = data[offset : offset + length]
                self.send_response(200)
                self.send_header("Content-Length", str(len(chunk)))
                self.end_headers()
                self.wfile.write(chunk)
                return None
            return self._json(400, {"RemoteException": {"message": f"unsupported op {op}"}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_webhdfs_client_plans_and_reads_a_window_from_a_fake_namenode(tmp_path):
    write_layout(tmp_path / "data", hours=2, rows=50, files=2)
    server = fake_webhdfs(tmp_path)
    try:
        uri = f"webhdfs://127.0.0.1:{server.server_address[1]}/data"
        job = make_job(job_doc(uri, hours=2), tmp_path / "hdfsjob")
        plans = list(Planner(job, "history", threads=1, ledger=False).plan())
        assert [len(p.tasks) for p in plans] == [4, 4]
        assert plans[0].tasks[0].uri == f"{uri}/impressions/20261101/00/part-000.parquet"
        assert run_window(job, "history", T0).manifest.rows == 100
    finally:
        server.shutdown()


def test_unreachable_namenode_is_an_error_not_a_missing_partition(tmp_path):
    job = make_job(job_doc("webhdfs://127.0.0.1:1/data", hours=1), tmp_path)
    with pytest.raises(OSError, match="127.0.0.1"):
        list(Planner(job, "history", threads=1, ledger=False).plan())
