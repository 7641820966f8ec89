"""bench/gpu_sharded.py: its CPU mode (2 gloo ranks, table-wise) steps single_tower and MTRM through the
trainer's ShardedStepper and ends with one JSON line; on a machine that cannot run the CUDA path
(no GPU, or fbgemm-gpu's CPU-only package) it stops in one line naming what to install."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "gpu_sharded.py"


def _bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def _module():
    spec = importlib.util.spec_from_file_location("gpu_sharded", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_two_ranks_print_steps_per_second_and_the_ratio(tmp_path):
    args = ["--device", "cpu", "--backend", "gloo", "--types", "table_wise", "--ranks", "2"]
    sizes = ["--steps", "3", "--warmup", "1", "--rows", "5000", "--batch", "64", "--pool", "4"]
    result = _bench(*args, *sizes, "--profile", str(tmp_path / "prof"))
    assert result.returncode == 0, result.stderr[-3000:]
    for mode in ("single_tower", "mtrm"):  # where each mode's step spends its time: the operators by self time
        text = (tmp_path / "prof" / f"profile_{mode}.txt").read_text()
        assert text.startswith("20 steps: wall ") and "CPU ops' self time" in text and "aten::" in text
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert lines[0].startswith("single_tower: ") and lines[1].startswith("mtrm: ") and "steps/s" in lines[1]
    assert report["bench"] == "gpu_sharded" and report["device"] == "cpu" and report["backend"] == "gloo"
    assert report["ranks"] == 2 and report["global_batch"] == 64 and report["steps"] == 3
    assert report["table_rows"] == 5000 and report["sharding_types"] == ["table_wise"]
    single, mtrm = report["single_tower_steps_per_s"], report["mtrm_steps_per_s"]
    assert single > 0 and mtrm > 0
    assert abs(report["ratio"] - single / mtrm) < 0.01 * report["ratio"]  # MTRM's time per step / single's
    assert abs(report["single_tower_samples_per_s"] - single * 64) <= 1
    assert {len(v) for v in report["rounds_s"].values()} == {1}
    plan = report["plan"]  # the planner's placement (MTRM's): every table, table-wise, across both ranks
    assert set(plan) == {f"{p}{f}" for p in ("t_", "fresh_", "reread_") for f in ("user_id", "item_id", "category")}
    assert {kind for shards in plan.values() for kind, _ in shards} == {"table_wise"}
    assert {ranks[0] for shards in plan.values() for _, ranks in shards} == {0, 1}
    assert report["versions"]["torch"] == metadata.version("torch")


def test_no_cuda_device_stops_in_one_line():
    result = _bench(env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpu_sharded: no CUDA device visible (torch {torch.__version__}); run on an NVIDIA GPU machine, "
        "or on the CPU with --device cpu --backend gloo --types table_wise"
    ]
    assert result.stdout == ""


def test_cuda_only_types_refused_on_the_cpu():
    result = _bench("--device", "cpu", "--types", "row_wise")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("gpu_sharded: --types: spec.training.sharding_types: ['row_wise'] need CUDA")


def test_cpu_only_fbgemm_names_the_cuda_wheel_to_install():
    """The venv's fbgemm-gpu-cpu cannot run the CUDA path: the message names the matching CUDA wheel."""
    bench = _module()
    assert bench.fbgemm_for_torch("2.13.0+cu130") == "fbgemm-gpu==1.8.*"
    assert bench.fbgemm_for_torch("2.11.0") == "fbgemm-gpu==1.6.*"
    problem = bench.fbgemm_problem()
    assert problem.startswith(f"fbgemm-gpu-cpu {metadata.version('fbgemm-gpu-cpu')} is installed (CPU kernels only)")
    assert f"{bench.fbgemm_for_torch()} built for CUDA {torch.version.cuda}" in problem
    assert "scripts/gpu_wheels.py" in problem
