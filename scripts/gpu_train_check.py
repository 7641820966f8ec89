#!/usr/bin/env python3
"""``primus train`` on CUDA end to end: the check behind docs/status.md's GPU line that the trainer
itself, not only ``bench/gpu_sharded.py``'s stepper, runs on a GPU.

A small MTRM job (datagen's data, 6 hourly batch windows committed as the data plane's Sink
commits them, the real-time events replayed from a file) with ``spec.training.sharding: dmp`` runs
under ``torchrun``, one rank per GPU (nccl for CUDA tensors, the tables sharded by TorchRec's
planner among its CUDA plans). It is killed with SIGKILL after 15 steps and run again to the end,
as ``tests/train/test_distributed.py`` does with two gloo ranks on the CPU; then every sample id
must have trained exactly once in the checkpointed model state (the ranks' ``--sample-log``), the
resumed run must have started from a checkpoint written by torch.distributed.checkpoint, and every
rank must say it trained on its GPU (the trainer's last line names its device; what ``nvidia-smi``
listed while the first run trained is reported beside it).

Run: python scripts/gpu_train_check.py [--ranks N] [--keep DIR]   (last line: one JSON object;
exit 1 when a check fails). Without a GPU it runs the same job on the CPU with 2 gloo ranks
(what CI's test runs) and says so in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

START = datetime(2026, 11, 1, tzinfo=UTC)
HOURS = 6
KILL_AFTER_STEPS = 15
SPEC = """\
apiVersion: primus.dev/v1alpha1
kind: PrimusJob
metadata: {{name: gpu-train-check}}
spec:
  timer: {{start: "2026-11-01T00:00:00Z", end: "2026-11-01T06:00:00Z", window: 1h}}
  dataset:
    streams:
      - name: history
        kind: batch
        lag: 2h
        sources:
          - {{name: impressions, uri: "{data}/impressions/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet, success_marker: _SUCCESS}}
          - {{name: clicks, uri: "{data}/clicks/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet, success_marker: _SUCCESS}}
        join: {{keys: [request_id], how: left, fill: {{clicked: 0}}}}
      - name: realtime
        kind: stream
        sources:
          - {{name: events, uri: "{data}/stream/events.jsonl", format: jsonl}}
  features:
    label: clicked
    timestamp: ts
    id: request_id
    sparse: [{{name: user_id, buckets: 2000}}, {{name: item_id, buckets: 2000}}, {{name: category, buckets: 64}}]
    dense: [price, age]
  model: {{embedding_dim: 16, memory_tower: [32, 16], adapt_tower: [16, 8]}}
  training: {{mode: mtrm, batch_size: 16, sharding: dmp, collective_timeout: 120s}}
  resources:
    backend: local
    roles:
      trainer: {{replicas: 1, cpu: 1, memory: 1Gi}}
  scaling: {{horizontal: {{enabled: false}}, vertical: {{enabled: false}}}}
"""


def prepare(root: Path) -> tuple[Path, Counter, list[int]]:
    """Data, spec and committed windows under ``root``: (spec, every (stream, id) produced, window sizes)."""
    import pyarrow.json as pajson

    from primus_lib.data.datagen.write import generate
    from primus_lib.data.shards import write_window
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.evaluation.replay import batch_window
    from primus_lib.paths import JobPaths, window_id
    from primus_lib.spec import load_job

    data = root / "data"
    os.environ["PRIMUS_HOME"] = str(root / "home")
    generate(data, START, START + timedelta(hours=HOURS), rows_per_hour=150, seed=7)
    spec = root / "job.yaml"
    spec.write_text(SPEC.format(data=data.as_uri()))
    job = load_job(spec)
    paths = JobPaths.for_job(job)
    queue = TrainingQueue(paths.ledger)
    stream = job.stream("history")
    produced = Counter(
        ("realtime", i) for i in pajson.read_json(data / "stream" / "events.jsonl")["request_id"].to_pylist()
    )
    sizes = []
    for hour in range(HOURS):
        start = START + timedelta(hours=hour)
        table = batch_window(job, stream, start)
        directory = paths.window_dir(stream.name, start)
        write_window(directory, table, stream=stream.name, window=window_id(start), seed=0, rows_per_shard=50)
        queue.append(stream.name, window_id(start), str(directory), table.num_rows)
        produced.update(("history", i) for i in table["request_id"].to_pylist())
        sizes.append(table.num_rows)
    return spec, produced, sizes


def gpu_processes() -> list[str]:
    """``pid, used memory`` of every process holding GPU memory (empty without nvidia-smi)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def steps_logged(logs: list[Path]) -> int:
    return min(p.read_text().count("\nstep ") if p.exists() else 0 for p in logs)


def sample_logs(log: Path, ranks: int) -> list[Path]:
    """The ranks' sample logs: ``LOG.rankN`` in a process group (torchrun's), else ``LOG``."""
    per_rank = [Path(f"{log}.rank{r}") for r in range(ranks)]
    return per_rank if ranks > 1 or per_rank[0].exists() else [log]


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def check(root: Path, ranks: int, cuda: bool) -> dict:
    from primus_lib.paths import JobPaths
    from primus_lib.spec import load_job
    from primus_lib.train.runtime.sample_log import first_run_pids, read_sample_log, read_sample_logs

    spec, produced, sizes = prepare(root)
    log = root / "ids.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)),
        *("-m", "primus_lib.cli.main", "train", str(spec), "--checkpoint-steps", "4"),
        *("--poll-interval", "0.05", "--idle-exit", "5", "--sample-log", str(log)),
    ]
    began = time.monotonic()
    first = subprocess.Popen(
        [*command, "--step-delay", "0.05"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seen_on_gpu: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while steps_logged(logs := sample_logs(log, ranks)) < KILL_AFTER_STEPS:
            if first.poll() is not None or time.monotonic() > deadline:
                out = first.stdout.read().decode(errors="replace") if first.stdout else ""
                raise SystemExit(
                    f"gpu_train_check: the first run ended before {KILL_AFTER_STEPS} steps:\n{out[-4000:]}"
                )
            time.sleep(0.02)
        seen_on_gpu = gpu_processes()
        kill([*first_run_pids(logs), first.pid])
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
        kill(first_run_pids(logs))
    time.sleep(1)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"gpu_train_check: the resumed run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    logs = sample_logs(log, ranks)
    resumed_at = [read_sample_log(p.read_text()).resumed_at for p in logs]
    counts = read_sample_logs([p.read_text() for p in logs]).count(produced)
    job = load_job(spec)
    final = [line for line in done.stdout.splitlines() if line.startswith("trainer ")]
    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    windows = [v["samples"] for k, v in sorted(progress["consumed"].items()) if k.startswith("history/")]
    sharded = Path(JobPaths.for_job(job).checkpoints) / "sharded"
    dcp = sorted(p.name for p in next(sharded.iterdir()).glob("*.distcp")) if sharded.exists() else []
    checks = {
        "exactly_once": counts.exactly_once,
        "resumed_from_a_checkpoint": all(len(r) == 2 and r[1] > 0 for r in resumed_at),
        "windows_trained_whole": windows == sizes,
        "dcp_file_per_rank": dcp == [f"__{r}_0.distcp" for r in range(ranks)],
        "trained_on_cuda": (len(final) == ranks and all(", on cuda:" in line for line in final)) if cuda else None,
    }
    return {
        "check": "gpu_train",
        "passed": all(v for v in checks.values() if v is not None),
        "checks": checks,
        "device": "cuda" if cuda else "cpu",
        "ranks": ranks,
        "resumed_at": resumed_at,
        "counts": str(counts),
        "windows": windows,
        "dcp_files": dcp,
        "gpu_processes_while_training": seen_on_gpu,
        "final": final,
        "elapsed_s": round(time.monotonic() - began, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, help="default: one per visible GPU; 2 on the CPU")
    parser.add_argument("--keep", type=Path, help="run under this (empty) directory and keep it")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    ranks = args.ranks or (torch.cuda.device_count() if cuda else 2)
    if cuda and ranks > torch.cuda.device_count():
        print(
            f"gpu_train_check: --ranks {ranks} needs {ranks} GPUs; {torch.cuda.device_count()} visible", file=sys.stderr
        )
        return 2
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = check(args.keep, ranks, cuda)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-train-check-") as tmp:
            result = check(Path(tmp), ranks, cuda)
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
