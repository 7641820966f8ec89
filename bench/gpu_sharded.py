"""The DMP-sharded trainer's step on CUDA: steps/s of single_tower and of MTRM, and their ratio.

N ranks (default: one per visible GPU, so one on a one-GPU machine: nccl refuses two ranks on
one device) build the trainer's own ``ShardedStepper`` (``primus_lib/train/distributed/sharded.py``)
on a job whose user and item tables have millions of rows (``--rows``), sharded ``row_wise``
(``--types``; the planner places the shards), and step it on synthetic minibatches built in memory beforehand: stream and batch
minibatches in turn, each batch minibatch the complete-label copy of the stream one before it (as
in Primus, so MTRM's delayed validation scores the rows it recorded). Ids are skewed (a few rows
take most lookups) and spread over the id space, so every row-wise shard serves hot rows.

Each mode is timed on the same minibatches after a warm-up, between barriers, the slowest rank's
time counting; ``--rounds`` alternate the modes and each keeps its best round.

``--profile DIR`` then profiles 20 steps of each mode (torch.profiler) into ``DIR/profile_MODE.txt``:
the profiled wall time, the operators' own CPU time and the device's busy time, and the operators
by self time; that is how docs/status.md found the step host-bound on an H200.

``--device cpu --backend gloo --types table_wise`` runs the same code on the CPU (what the tests
run). Without a CUDA device, or with fbgemm-gpu's CPU-only package (``fbgemm-gpu-cpu``, what the
project's venv holds), it exits with one line naming what to install: the CUDA ``fbgemm-gpu``
wheel that matches torch, installed from handed-over parts by ``scripts/gpu_wheels.py``.

Run: .venv/bin/python bench/gpu_sharded.py   (last line: one JSON object, ``ratio`` = MTRM's time
per step over single_tower's)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

MODES = ("single_tower", "mtrm")
HELPER = "scripts/gpu_wheels.py (docs/training.md, 'Several ranks')"
# (device) -> defaults: table rows, embedding dim, global minibatch, timed steps, warm-up, rounds
DEFAULTS = {
    "cuda": {"rows": 4_000_000, "dim": 64, "batch": 8192, "steps": 200, "warmup": 20, "rounds": 3},
    "cpu": {"rows": 20_000, "dim": 16, "batch": 256, "steps": 20, "warmup": 4, "rounds": 1},
}

SPEC = """\
apiVersion: primus.dev/v1alpha1
kind: PrimusJob
metadata: {{name: gpu-sharded-bench}}
spec:
  timer: {{start: "2026-11-01T00:00:00Z", end: "2026-11-02T00:00:00Z", window: 1h}}
  dataset:
    streams:
      - name: history
        kind: batch
        lag: 24h
        sources:
          - {{name: samples, uri: "file:///nonexistent/samples/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet}}
      - name: realtime
        kind: stream
        sources:
          - {{name: events, uri: "file:///nonexistent/stream/events.jsonl", format: jsonl}}
  features:
    label: clicked
    timestamp: ts
    id: request_id
    sparse: [{{name: user_id, buckets: {rows}}}, {{name: item_id, buckets: {rows}}}, {{name: category, buckets: 1024}}]
    dense: [price, age]
  model: {{embedding_dim: {dim}, memory_tower: [{wide}, {narrow}], adapt_tower: [{narrow}, {narrow}]}}
  training: {{mode: mtrm, batch_size: {batch}, learning_rate: 0.001, sharding: dmp}}
  resources:
    backend: local
    roles:
      trainer: {{replicas: 1, cpu: 1, memory: 1Gi}}
  scaling: {{horizontal: {{enabled: false}}, vertical: {{enabled: false}}}}
"""


class BenchError(Exception):
    """A setup problem, reported in one line."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl on cuda, gloo on the CPU")
    parser.add_argument("--types", help="comma-separated sharding types (default: row_wise on cuda, table_wise)")
    parser.add_argument("--ranks", type=int, help="default: one per visible GPU; 2 on the CPU")
    for name in DEFAULTS["cuda"]:
        parser.add_argument(
            f"--{name}", type=int, help=f"default: {DEFAULTS['cuda'][name]} (cuda), {DEFAULTS['cpu'][name]} (cpu)"
        )
    parser.add_argument("--pool", type=int, default=16, help="distinct minibatches per rank, cycled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile", type=Path, help="also profile 20 steps of each mode (torch.profiler) into DIR/profile_MODE.txt"
    )
    args = parser.parse_args(argv)
    for name, value in DEFAULTS[args.device].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    args.types = [t for t in (args.types or ("row_wise" if args.device == "cuda" else "table_wise")).split(",") if t]
    return args


def fbgemm_for_torch(version: str = torch.__version__) -> str:
    """The fbgemm-gpu release built against this torch: 1.N goes with 2.(N+5) (1.8 with 2.13)."""
    major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    return f"fbgemm-gpu==1.{minor - 5}.*" if major == 2 and minor >= 5 else "fbgemm-gpu"


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fbgemm_problem() -> str | None:
    """Why TorchRec's CUDA kernels cannot run here (None: they can)."""
    cuda = torch.version.cuda or "none"
    wanted = f"{fbgemm_for_torch()} built for CUDA {cuda} (torch {torch.__version__})"
    cpu_only = _installed("fbgemm-gpu-cpu")
    if cpu_only:
        return f"fbgemm-gpu-cpu {cpu_only} is installed (CPU kernels only): install {wanted} in its place: {HELPER}"
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception as error:  # a wheel built for another torch/CUDA fails to load its libraries
        return f"fbgemm_gpu does not load ({_first_line(error)}): install {wanted}: {HELPER}"
    try:
        torch.ops.fbgemm.asynchronous_complete_cumsum(torch.ones(2, dtype=torch.int64, device="cuda"))
    except Exception as error:
        return f"fbgemm_gpu {_installed('fbgemm-gpu')} has no CUDA kernels ({_first_line(error)}): install {wanted}: {HELPER}"
    return None


def cuda_problem(ranks: int) -> str | None:
    """Why this machine cannot run ``ranks`` nccl ranks (None: it can)."""
    if not torch.cuda.is_available():
        return (
            f"no CUDA device visible (torch {torch.__version__}); run on an NVIDIA GPU machine, "
            "or on the CPU with --device cpu --backend gloo --types table_wise"
        )
    count = torch.cuda.device_count()
    if ranks > count:
        return f"--ranks {ranks} needs {ranks} GPUs (nccl: one rank per GPU); {count} visible"
    return fbgemm_problem()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def check_setup(args: argparse.Namespace) -> None:
    """Refuse in one line what cannot run (before any rank starts)."""
    from primus_lib.train.distributed.sharded import sharding_types

    if args.device == "cpu" and args.backend == "nccl":
        raise BenchError("--backend nccl needs --device cuda")
    if args.ranks is None:
        args.ranks = max(torch.cuda.device_count(), 1) if args.device == "cuda" and torch.cuda.is_available() else 2
    if args.ranks < 1 or args.batch < args.ranks or min(args.steps, args.rows, args.dim, args.rounds, args.pool) < 1:
        raise BenchError("--ranks, --steps, --rows, --dim, --rounds, --pool must be >= 1 and --batch >= --ranks")
    try:
        sharding_types(torch.device(args.device), args.types)
    except ValueError as error:
        raise BenchError(f"--types: {error}") from None
    if args.device == "cuda":
        problem = cuda_problem(args.ranks)
        if problem:
            raise BenchError(problem)


def spec_text(args: argparse.Namespace) -> str:
    wide = max(4 * args.dim, 32)
    return SPEC.format(rows=args.rows, dim=args.dim, batch=args.batch, wide=wide, narrow=wide // 2)


def _ids(rng: np.random.Generator, n: int, rows: int) -> np.ndarray:
    """Skewed ids (a few rows take most lookups) spread over ``rows`` by a multiplicative hash."""
    hot = (rng.random(n) ** 4 * rows).astype(np.int64)
    return (hot * 2654435761) % rows


def minibatches(job, rank: int, world: int, args: argparse.Namespace) -> list:
    """This rank's share of ``args.pool`` minibatches: stream, then its rows' complete-label batch copy."""
    import pyarrow as pa

    from primus_lib.train.model.batch import to_batch

    rows = args.batch // world
    out = []
    for pair in range((args.pool + 1) // 2):
        rng = np.random.default_rng([args.seed, rank, pair])
        item = _ids(rng, rows, args.rows)
        price = rng.lognormal(size=rows).astype(np.float32)
        clicked = (rng.random(rows) < 1 / (1 + np.exp(2.0 - (item % 7) * 0.3 + np.log(price)))).astype(np.int64)
        late = rng.random(rows) < 0.2  # the stream copy misses a fifth of the clicks
        columns = {
            "ts": np.arange(rows, dtype=np.int64),
            "request_id": [f"r{rank}-{pair}-{i}" for i in range(rows)],
            "user_id": _ids(rng, rows, args.rows),
            "item_id": item,
            "category": item % 1024,
            "price": price,
            "age": rng.normal(size=rows).astype(np.float32),
        }
        stream = pa.table({**columns, "clicked": clicked * ~late})
        complete = pa.table({**columns, "clicked": clicked})
        out.append(("stream", to_batch(stream, job.spec.features, "request_id")))
        out.append(("batch", to_batch(complete, job.spec.features, "request_id")))
    return out[: args.pool]


def timed(stepper, pool: list, steps: int, warmup: int, global_rows: int, start: int = 0) -> float:
    """Seconds for ``steps`` steps on every rank together (the slowest rank's), after ``warmup`` steps."""
    import torch.distributed as dist

    for i in range(warmup):
        kind, batch = pool[(start + i) % len(pool)]
        stepper.step(kind, batch, global_rows)
    _sync(stepper.device)
    dist.barrier()
    began = time.perf_counter()
    for i in range(steps):
        kind, batch = pool[(start + warmup + i) % len(pool)]
        stepper.step(kind, batch, global_rows)
    _sync(stepper.device)
    elapsed = time.perf_counter() - began
    return stepper.group.max([elapsed])[0]


def profile(stepper, pool: list, global_rows: int, out: Path | None, steps: int = 20) -> None:
    """Where a mode's step spends its time: torch.profiler's operators by self time, CPU and (on CUDA)
    the device's, over ``steps`` steps, under the profiled wall time (rank 0 writes ``out``)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = stepper.device.type == "cuda"
    with torch_profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        began = time.perf_counter()
        for i in range(steps):
            kind, batch = pool[i % len(pool)]
            stepper.step(kind, batch, global_rows)
        _sync(stepper.device)
        wall = time.perf_counter() - began
    if out is None:
        return
    table = prof.key_averages()
    sections = [("self_cpu_time_total", "CPU"), *([("self_device_time_total", "device")] if cuda else [])]
    cpu = sum(e.self_cpu_time_total for e in table) / 1e6
    # the device's busy time: its kernels and copies (CPU ops carry their kernels' time too: counted once)
    device = sum(e.self_device_time_total for e in table if e.device_type != DeviceType.CPU) / 1e6
    busy = f"CPU ops' self time {cpu:.4f} s" + (f", device busy {device:.4f} s" if cuda else "")
    parts = [f"{steps} steps: wall {wall:.4f} s (profiled); {busy}"]
    parts += [f"by self {name} time\n" + table.table(sort_by=key, row_limit=30) for key, name in sections]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n\n".join(parts) + "\n")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rank(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    """Build both modes' sharded steppers, time them round by round; rank 0 returns the figures."""
    from primus_lib.spec import parse_job
    from primus_lib.train.distributed.sharded import ShardedStepper, table_placement

    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    job = parse_job(spec_text(args), "bench/gpu_sharded.py")
    pool = minibatches(job, rank, world, args)
    global_rows = (args.batch // world) * world
    steppers = {m: ShardedStepper(job, device=device, types=tuple(args.types), mode=m) for m in MODES}
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            seconds[mode].append(timed(steppers[mode], pool, args.steps, args.warmup, global_rows))
    if args.profile is not None:
        for mode in MODES:
            profile(steppers[mode], pool, global_rows, args.profile / f"profile_{mode}.txt" if not rank else None)
    if rank:
        return None
    return report(args, world, seconds, table_placement(steppers["mtrm"].dmp), device)


def report(args: argparse.Namespace, world: int, seconds: dict[str, list[float]], plan: dict, device) -> dict:
    per_s = {m: args.steps / min(seconds[m]) for m in MODES}
    global_rows = (args.batch // world) * world
    return {
        "bench": "gpu_sharded",
        "ratio": round(per_s["single_tower"] / per_s["mtrm"], 4),  # MTRM's time per step / single_tower's
        "single_tower_steps_per_s": round(per_s["single_tower"], 2),
        "mtrm_steps_per_s": round(per_s["mtrm"], 2),
        "single_tower_samples_per_s": round(per_s["single_tower"] * global_rows),
        "mtrm_samples_per_s": round(per_s["mtrm"] * global_rows),
        "rounds_s": {m: [round(s, 4) for s in seconds[m]] for m in MODES},
        "device": args.device,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "backend": args.backend,
        "ranks": world,
        "sharding_types": args.types,
        "plan": plan,
        "table_rows": args.rows,
        "embedding_dim": args.dim,
        "global_batch": global_rows,
        "steps": args.steps,
        "warmup": args.warmup,
        "versions": {p: _installed(p) for p in ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu")},
    }


def _worker(rank: int, world: int, args: argparse.Namespace, store: str, out: str) -> None:
    """One rank: its device, the process group (gloo for CPU tensors, nccl for CUDA ones, as
    ``primus train`` under torchrun), the bench; rank 0 writes the figures to ``out``."""
    import torch.distributed as dist

    if args.device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    backend = "cpu:gloo,cuda:nccl" if args.backend == "nccl" else "gloo"
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(minutes=10)
    )
    try:
        result = run_rank(rank, world, args)
        if result is not None:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_setup(args)
    except BenchError as error:
        print(f"gpu_sharded: {error}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="gpu-sharded-") as tmp:
        out = Path(tmp) / "result.json"
        try:
            mp.spawn(_worker, args=(args.ranks, args, str(Path(tmp) / "store"), str(out)), nprocs=args.ranks)
        except Exception as error:  # a rank's traceback is in the message
            print(error, file=sys.stderr)
            print(f"gpu_sharded: a rank failed: {_first_line(error)}", file=sys.stderr)
            return 1
        result = json.loads(out.read_text())
    for mode in MODES:
        print(f"{mode}: {result[f'{mode}_steps_per_s']} steps/s, {result[f'{mode}_samples_per_s']} samples/s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
