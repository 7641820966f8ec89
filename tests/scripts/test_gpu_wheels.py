"""scripts/gpu_wheels.py: a wheel split into parts with a manifest of sha256s, handed over, reassembled
byte for byte and installed with ``pip --no-deps --no-index`` in place of the CPU-only variant; a
missing, damaged or oddly named part refuses in one line and installs nothing. (The real download,
``pack``, needs PyPI and ~490 MB: checked by hand, docs/status.md.)"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_wheels.py"
NO_PYTHON = "/nonexistent/python"  # refusals must come before any pip: never this venv's fbgemm-gpu-cpu


def _module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def _fake_wheel(directory: Path, project: str, version: str, variant: str, padding: int = 0, repeats: int = 1) -> Path:
    """A valid pure-Python wheel of ``project`` holding the package ``fbgemm_gpu`` (VARIANT = variant),
    with ``padding`` incompressible bytes so it splits into several parts; ``repeats`` copies of
    them, 64 KiB apart or more (one kernel per GPU architecture), deflated member by member."""
    dist = f"{project}-{version}.dist-info"
    blob = os.urandom(padding)
    files = {
        "fbgemm_gpu/__init__.py": f"VARIANT = {variant!r}\n".encode(),
        "fbgemm_gpu/blob.bin": b"".join(blob + bytes(i) for i in range(repeats)),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {project.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{project}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_split_verify_reassemble_byte_for_byte(tmp_path):
    wheel = tmp_path / "fbgemm_gpu-9.9.9-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(os.urandom(2500))
    small = tmp_path / "tiny-1.0-py3-none-any.whl"
    small.write_bytes(b"x" * 1024)  # exactly one part: no empty trailing part
    out = tmp_path / "parts"
    result = _cli("split", out, wheel, small, "--part-size", "1K", "--compress", "none")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    big, tiny = manifest["wheels"]
    assert [p["size"] for p in big["parts"]] == [1024, 1024, 452]
    assert [p["name"] for p in tiny["parts"]] == [f"{small.name}.part000"] and tiny["parts"][0]["size"] == 1024
    assert big["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", *(p["name"] for w in manifest["wheels"] for p in w["parts"])]
    )
    assert _cli("verify", out).returncode == 0
    assembled = _module().assemble(out, tmp_path / "whole")
    assert [p.read_bytes() for p in assembled] == [wheel.read_bytes(), small.read_bytes()]


def test_missing_damaged_or_unsafe_parts_refused_in_one_line(tmp_path):
    wheel = tmp_path / "fbgemm_gpu-9.9.9-py3-none-any.whl"
    wheel.write_bytes(os.urandom(3000))
    out = tmp_path / "parts"
    assert _cli("split", out, wheel, "--part-size", "1K", "--compress", "none").returncode == 0
    part = out / f"{wheel.name}.part001"
    original = part.read_bytes()

    part.unlink()
    result = _cli("install", out, "--python", NO_PYTHON)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"gpu_wheels: {out}: 1 of 3 parts missing: {part.name}"]

    part.write_bytes(bytes([original[0] ^ 1]) + original[1:])  # same size, one bit flipped
    result = _cli("verify", out)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert f"sha256 differs from the manifest: {part.name}" in result.stderr

    part.write_bytes(original)
    manifest = json.loads((out / "manifest.json").read_text())
    good = manifest["wheels"][0]["sha256"]
    (out / "manifest.json").write_text(
        json.dumps({**manifest, "wheels": [{**manifest["wheels"][0], "sha256": "0" * 64}]})
    )
    result = _cli("install", out, "--python", NO_PYTHON)  # every part intact, the whole differs: nothing is installed
    assert result.returncode == 1 and f"reassembled sha256 {good} != manifest {'0' * 64}" in result.stderr

    manifest["wheels"][0]["parts"][0]["name"] = "../outside.whl"
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = _cli("verify", out)
    assert result.returncode == 1 and "'../outside.whl' is not a plain file name" in result.stderr

    result = _cli("verify", tmp_path / "nothing-here")
    assert result.returncode == 1 and "no manifest" in result.stderr


def _scratch_python(path: Path) -> str:
    """A venv with a pip (the base interpreter's, else ensurepip's) and nothing installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(path)], check=True)
    python = str(path / "bin" / "python")
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode:
        subprocess.run([python, "-m", "ensurepip", "-q"], check=True)
    return python


def _variant(python: str) -> str:
    code = "import fbgemm_gpu, importlib.metadata as m; print(fbgemm_gpu.VARIANT, m.version('fbgemm-gpu'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _has(python: str, project: str) -> bool:
    code = f"import importlib.metadata as m; m.version({project!r})"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def test_install_from_parts_replaces_the_cpu_variant(tmp_path):
    python = _scratch_python(tmp_path / "venv")
    cpu = _fake_wheel(tmp_path, "fbgemm_gpu_cpu", "0.0.1", "cpu")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(cpu)], check=True)
    assert _has(python, "fbgemm-gpu-cpu") and not _has(python, "fbgemm-gpu")
    gpu = _fake_wheel(tmp_path, "fbgemm_gpu", "0.0.2", "cuda", padding=5000)
    out = tmp_path / "parts"
    assert _cli("split", out, gpu, "--part-size", "2K", "--compress", "none").returncode == 0
    assert len(json.loads((out / "manifest.json").read_text())["wheels"][0]["parts"]) >= 3
    gpu.unlink()  # only the parts travel

    result = _cli("install", out, "--python", python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == ["installed fbgemm_gpu-0.0.2-py3-none-any.whl"]
    assert _variant(python) == "cuda 0.0.2"
    assert not _has(python, "fbgemm-gpu-cpu")  # swapped out, not left beside it


def test_xz_parts_carry_a_repeating_wheel_in_a_fraction_and_install_the_same_files(tmp_path):
    """The default: the wheel's members stored, then xz: copies 64 KiB+ apart cost almost nothing
    (deflate, the wheel's own, pays for each); the wheel reassembled holds the same files."""
    gpu = _fake_wheel(tmp_path, "fbgemm_gpu", "0.0.3", "cuda", padding=96 << 10, repeats=8)
    out = tmp_path / "parts"
    result = _cli("split", out, gpu, "--part-size", "64K")
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads((out / "manifest.json").read_text())["wheels"]
    travels = sum(p["size"] for p in entry["parts"])
    assert entry["compression"] == "xz" and entry["source_sha256"] == hashlib.sha256(gpu.read_bytes()).hexdigest()
    assert travels < gpu.stat().st_size / 4 and len(entry["parts"]) == -(-travels // (64 << 10))

    (whole,) = _module().assemble(out, tmp_path / "whole")
    with zipfile.ZipFile(gpu) as source, zipfile.ZipFile(whole) as copy:
        assert copy.namelist() == source.namelist()
        assert all(copy.read(n) == source.read(n) for n in source.namelist())
        assert {i.compress_type for i in copy.infolist()} == {zipfile.ZIP_STORED}

    python = _scratch_python(tmp_path / "venv")
    gpu.unlink()
    result = _cli("install", out, "--python", python)
    assert result.returncode == 0, result.stderr
    assert _variant(python) == "cuda 0.0.3"

    last = out / entry["parts"][-1]["name"]
    last.write_bytes(last.read_bytes()[:-1])  # a truncated stream is refused before any pip, by the part's size
    result = _cli("install", out, "--python", NO_PYTHON)
    assert result.returncode == 1 and f"sha256 differs from the manifest: {last.name}" in result.stderr


def test_pack_defaults_to_the_cuda_build_of_this_venvs_fbgemm():
    """What ``pack`` downloads by default: fbgemm-gpu at the CPU package's version (1.8.0 = torch 2.13)."""
    module = _module()
    assert module.default_requirements(sys.executable) == [f"fbgemm-gpu=={metadata.version('fbgemm-gpu-cpu')}"]
    with pytest.raises(module.WheelError, match="no-such-python: not an interpreter"):
        module.default_requirements(str(ROOT / "no-such-python"))
