#!/usr/bin/env python3
"""Carry wheels too big for one transfer (fbgemm-gpu's CUDA wheel: ~490 MB) to a machine without a
package index, in parts, and install them there (stdlib only: it runs before anything is installed).

On a machine that reaches PyPI::

    scripts/gpu_wheels.py pack DIR [REQ ...] [--python-version 3.11] [--part-size 60M]

downloads the wheels (default: ``fbgemm-gpu`` at the version of the ``fbgemm-gpu-cpu`` installed
here; on PyPI that is the CUDA build matching torch's release: fbgemm-gpu 1.8.0 is built for CUDA
13.0 and torch 2.13), compresses each and splits it into parts of at most ``--part-size``, with
``DIR/manifest.json``: every wheel's and part's size and sha256. ``split DIR WHEEL ...`` does the
same for wheel files already at hand. Hand over ``DIR``'s parts in as many transfers as needed.

Compression (``--compress xz``, the default) is why the parts are few: a wheel is a zip whose
members are deflated one by one, and fbgemm-gpu's CUDA libraries repeat each kernel for every GPU
architecture, which deflate's 32 KiB window cannot see. So the wheel is repacked with its members
stored (the same files, names, order and RECORD) and that is compressed with xz's large window:
fbgemm-gpu 1.6.0's 465 MB wheel (2.54 GB stored) travels as 157 MB, 3 parts of 56 MiB instead of
8. The manifest keeps the repacked wheel's sha256 and the downloaded one's (``source_sha256``).
``--compress none`` splits the wheel as it is, byte for byte.

On the GPU machine::

    scripts/gpu_wheels.py install DIR [--python PYTHON]

checks that every part is there with its sha256 (``verify DIR`` only checks), reassembles each
wheel and checks its sha256, removes ``fbgemm-gpu-cpu`` when ``fbgemm-gpu`` comes in (both install
the package ``fbgemm_gpu``), then ``pip install --no-deps --no-index`` the wheels. A missing or
damaged part is named in one line and nothing is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"
CHUNK = 1 << 20
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
CPU_VARIANT = {"fbgemm_gpu": "fbgemm-gpu-cpu"}  # a wheel's project -> the package it replaces
COMPRESSIONS = ("xz", "none")


class WheelError(Exception):
    """A problem reported in one line."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def part_size(text: str) -> int:
    """``60M`` -> bytes (K/M/G are binary, as coreutils' split reads them)."""
    match = re.fullmatch(r"(\d+)([KMG]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"part size: expected a positive size such as 60M, got {text!r}")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


# -- pack -------------------------------------------------------------------------------------
def split(wheels: list[Path], out: Path, size: int, compression: str = "xz") -> dict:
    """Write each wheel's parts into ``out`` and the manifest last (a reader sees all of it or none)."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for wheel in wheels:
        if not wheel.name.endswith(".whl") or not SAFE_NAME.match(wheel.name):
            raise WheelError(f"{wheel}: not a wheel file name")
        with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
            entry: dict = {"name": wheel.name, "compression": compression}
            if compression == "xz":
                stored = repack_stored(wheel, Path(tmp) / wheel.name)
                payload = compress_xz(stored, Path(tmp) / f"{wheel.name}.xz")
                entry.update(size=stored.stat().st_size, sha256=sha256(stored), source_sha256=sha256(wheel))
            else:
                payload = wheel
                entry.update(size=wheel.stat().st_size, sha256=sha256(wheel))
            entry["parts"] = _split_file(payload, out, wheel.name, size)
        entries.append(entry)
    manifest = {"format": 2, "part_size": size, "wheels": entries}
    staging = out / f".{MANIFEST}.tmp"
    staging.write_text(json.dumps(manifest, indent=1) + "\n")
    staging.replace(out / MANIFEST)
    return manifest


def repack_stored(wheel: Path, target: Path) -> Path:
    """The wheel with its members stored, not deflated: same names, order, dates, modes and RECORD."""
    try:
        with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as sink:
            for info in source.infolist():
                copy = zipfile.ZipInfo(info.filename, info.date_time)
                copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_STORED
                with source.open(info) as reader, sink.open(copy, "w", force_zip64=info.file_size >= 1 << 31) as writer:
                    shutil.copyfileobj(reader, writer, CHUNK)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as error:
        raise WheelError(f"{wheel}: not a readable wheel ({error}); --compress none splits it as it is") from None
    return target


def compress_xz(path: Path, target: Path) -> Path:
    """xz at its largest preset: the ``xz`` program on all cores where there is one, else the stdlib."""
    if program := shutil.which("xz"):
        with target.open("wb") as sink:
            result = subprocess.run([program, "-9", "-T0", "-c", str(path)], stdout=sink, stderr=subprocess.PIPE)
        if result.returncode:
            raise WheelError(f"xz {path.name} failed: {result.stderr.decode(errors='replace').strip()}")
        return target
    with path.open("rb") as source, lzma.open(target, "wb", preset=9) as sink:
        shutil.copyfileobj(source, sink, CHUNK)
    return target


def _split_file(path: Path, out: Path, name: str, size: int) -> list[dict]:
    parts: list[dict] = []
    with path.open("rb") as source:
        while True:
            part = f"{name}.part{len(parts):03d}"
            written = _copy_part(source, out / part, size)
            if not written and parts:
                (out / part).unlink()
                break
            parts.append({"name": part, "size": written, "sha256": sha256(out / part)})
            if written < size:
                break
    return parts


def _copy_part(source, target: Path, size: int) -> int:
    written = 0
    with target.open("wb") as sink:
        while written < size and (block := source.read(min(CHUNK, size - written))):
            sink.write(block)
            written += len(block)
    return written


def download(
    requirements: list[str], python: str, python_version: str | None, platforms: list[str], into: Path
) -> list[Path]:
    """``pip download --no-deps`` of binary wheels (for another interpreter with ``python_version``)."""
    command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(into)]
    if python_version:
        command += ["--python-version", python_version, "--implementation", "cp"]
        command += [arg for platform in platforms for arg in ("--platform", platform)]
    result = subprocess.run([*command, *requirements], capture_output=True, text=True)
    if result.returncode:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise WheelError(f"pip download {' '.join(requirements)} failed: {tail}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise WheelError(f"pip download {' '.join(requirements)} gave no wheel")
    return wheels


def default_requirements(python: str) -> list[str]:
    """``fbgemm-gpu`` at the version of the ``fbgemm-gpu-cpu`` that ``python`` has."""
    version = _installed_version(python, "fbgemm-gpu-cpu")
    if not version:
        raise WheelError(f"{python} has no fbgemm-gpu-cpu to match: name the wheels, e.g. fbgemm-gpu==1.8.0")
    return [f"fbgemm-gpu=={version}"]


def _installed_version(python: str, project: str) -> str | None:
    code = f"import importlib.metadata as m\ntry: print(m.version({project!r}))\nexcept m.PackageNotFoundError: pass"
    try:
        result = subprocess.run([python, "-c", code], capture_output=True, text=True)
    except OSError as error:
        raise WheelError(f"{python}: not an interpreter ({error.strerror})") from None
    if result.returncode:
        raise WheelError(f"{python} does not run: {(result.stderr.strip().splitlines() or [''])[-1]}")
    return result.stdout.strip() or None


# -- install ------------------------------------------------------------------------------------
def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        wheels = manifest["wheels"]
        for wheel in wheels:
            for name in [wheel["name"], *(p["name"] for p in wheel["parts"])]:
                if not isinstance(name, str) or not SAFE_NAME.match(name):
                    raise WheelError(f"{path}: {name!r} is not a plain file name")
            if not wheel["name"].endswith(".whl") or not wheel["parts"]:
                raise WheelError(f"{path}: {wheel['name']!r} is not a wheel with parts")
            if wheel.setdefault("compression", "none") not in COMPRESSIONS:  # format 1 had none
                raise WheelError(
                    f"{path}: {wheel['name']}: compression {wheel['compression']!r} is not one of {COMPRESSIONS}"
                )
    except FileNotFoundError:
        raise WheelError(f"{path}: no manifest (made by `gpu_wheels.py pack` or `split`)") from None
    except (ValueError, KeyError, TypeError) as error:
        raise WheelError(f"{path}: not a gpu_wheels manifest ({type(error).__name__}: {error})") from None
    return manifest


def verify(directory: Path) -> dict:
    """Every part present with its size and sha256; else one line naming what is missing or damaged."""
    manifest = read_manifest(directory)
    missing, damaged = [], []
    for wheel in manifest["wheels"]:
        for part in wheel["parts"]:
            path = directory / part["name"]
            if not path.is_file():
                missing.append(part["name"])
            elif path.stat().st_size != part["size"] or sha256(path) != part["sha256"]:
                damaged.append(part["name"])
    total = sum(len(w["parts"]) for w in manifest["wheels"])
    if missing:
        raise WheelError(f"{directory}: {len(missing)} of {total} parts missing: {', '.join(missing)}")
    if damaged:
        raise WheelError(f"{directory}: parts whose size or sha256 differs from the manifest: {', '.join(damaged)}")
    return manifest


def assemble(directory: Path, into: Path) -> list[Path]:
    """The verified wheels, whole, in ``into`` (each checked against its own sha256)."""
    manifest = verify(directory)
    into.mkdir(parents=True, exist_ok=True)
    wheels = []
    for wheel in manifest["wheels"]:
        target = into / wheel["name"]
        staging = into / f".{wheel['name']}.tmp"
        with staging.open("wb") as sink:
            _write_whole(directory, wheel, sink)
        got = sha256(staging)
        if got != wheel["sha256"]:
            staging.unlink()
            raise WheelError(f"{wheel['name']}: reassembled sha256 {got} != manifest {wheel['sha256']}")
        staging.replace(target)
        wheels.append(target)
    return wheels


def _write_whole(directory: Path, wheel: dict, sink) -> None:
    """The parts in order into ``sink``, decompressed where the wheel was packed with xz."""
    decompressor = lzma.LZMADecompressor(lzma.FORMAT_XZ) if wheel["compression"] == "xz" else None
    for part in wheel["parts"]:
        with (directory / part["name"]).open("rb") as source:
            while block := source.read(CHUNK):
                if decompressor is None:
                    sink.write(block)
                    continue
                try:
                    sink.write(decompressor.decompress(block))
                except lzma.LZMAError as error:
                    raise WheelError(f"{part['name']}: not the xz stream the manifest names ({error})") from None
    if decompressor is not None and (not decompressor.eof or decompressor.unused_data):
        raise WheelError(f"{wheel['name']}: its xz stream does not end where its last part does")


def install(directory: Path, python: str) -> list[str]:
    """Verify, reassemble, swap out CPU-only variants, ``pip install --no-deps --no-index``."""
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        wheels = assemble(directory, Path(tmp))
        projects = [w.name.split("-")[0] for w in wheels]
        replaced = [CPU_VARIANT[p] for p in projects if p in CPU_VARIANT]
        for project in replaced:
            if _installed_version(python, project):
                _pip(python, ["uninstall", "-y", project], f"removing {project}")
        _pip(python, ["install", "--no-deps", "--no-index", *map(str, wheels)], "pip install", replaced)
    return [w.name for w in wheels]


def _pip(python: str, args: list[str], what: str, removed: list[str] | None = None) -> None:
    result = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True)
    if result.returncode:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        note = f" ({', '.join(removed)} was removed before it)" if removed else ""
        raise WheelError(f"{what} failed{note}: {tail}")


# -- command line -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="download wheels (PyPI) and split them into DIR")
    pack.add_argument("dir", type=Path)
    pack.add_argument("requirements", nargs="*", help="default: fbgemm-gpu==<this venv's fbgemm-gpu-cpu version>")
    pack.add_argument("--python", default=sys.executable, help="the interpreter whose pip downloads")
    pack.add_argument("--python-version", help="wheels for another Python (e.g. 3.12; default: --python's)")
    pack.add_argument(
        "--platform",
        action="append",
        help="with --python-version, repeatable (default: manylinux_2_28 and 2_17 x86_64)",
    )
    cut = sub.add_parser("split", help="split wheel files at hand into DIR")
    cut.add_argument("dir", type=Path)
    cut.add_argument("wheels", nargs="+", type=Path)
    for command in (pack, cut):
        command.add_argument("--part-size", type=part_size, default=part_size("60M"))
        command.add_argument(
            "--compress", choices=COMPRESSIONS, default="xz", help="default: xz (see the module's doc)"
        )
    check = sub.add_parser("verify", help="check DIR's parts against its manifest")
    check.add_argument("dir", type=Path)
    put = sub.add_parser("install", help="verify, reassemble and pip install DIR's wheels")
    put.add_argument("dir", type=Path)
    put.add_argument("--python", default=sys.executable, help="the interpreter to install into")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (WheelError, OSError) as error:
        print(f"gpu_wheels: {error}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command in ("pack", "split"):
        if args.command == "pack":
            requirements = args.requirements or default_requirements(args.python)
            with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
                platforms = args.platform or ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64"]
                wheels = download(requirements, args.python, args.python_version, platforms, Path(tmp))
                manifest = split(wheels, args.dir, args.part_size, args.compress)
        else:
            manifest = split(args.wheels, args.dir, args.part_size, args.compress)
        for wheel in manifest["wheels"]:
            travels = sum(p["size"] for p in wheel["parts"])
            print(
                f"{wheel['name']}: {wheel['size']} bytes, {travels} in {len(wheel['parts'])} parts, sha256 {wheel['sha256']}"
            )
        print(f"hand over {args.dir}/{MANIFEST} and its parts, then: scripts/gpu_wheels.py install DIR")
    elif args.command == "verify":
        manifest = verify(args.dir)
        print(f"{args.dir}: {sum(len(w['parts']) for w in manifest['wheels'])} parts present and intact")
    else:
        for name in install(args.dir, args.python):
            print(f"installed {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
