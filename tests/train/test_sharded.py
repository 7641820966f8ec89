"""The DMP-sharded MTRM model with two gloo ranks on the CPU: table_wise places tables on both
ranks, a batch step never moves the adapt tower and a stream step trains both towers on every
rank, a zero-row rank joins a step, the loss falls on learnable data, the pair equals one
replicated process, and a DCP checkpoint round-trips into a freshly built sharded model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from primus_lib.spec import load_job
from primus_lib.train.checkpoint.store import load_latest, save_checkpoint
from primus_lib.train.model.batch import to_batch
from tests.fixtures.specs import job_doc, write_spec
from tests.train.conftest import write_job

ROWS = 64  # global minibatch; each rank takes half
KINDS = ["batch", "stream"] * 12
EMPTY_STEP = 3  # a stream step in which rank 1 has no rows
# Both kinds move the tables: the two paths stay within 1e-5 for about 14 steps and part by 1e-3 by
# step 20 (measured): the float summation order differs, and row-wise Adagrad's step on a row with
# little accumulated gradient is about lr x the gradient's sign, so a near-zero sum can flip it.
MATCH_STEPS = 12


def _table(rng: np.random.Generator, rows: int) -> pa.Table:
    """Learnable rows: the label is a function of item_id parity and the sign of price."""
    item = rng.integers(0, 40, rows)
    price = rng.normal(size=rows).astype(np.float32)
    label = ((item % 2 == 0) ^ (price > 1.0)).astype(np.int64)
    return pa.table(
        {
            "ts": np.arange(rows, dtype=np.int64),
            "user_id": rng.integers(0, 30, rows),
            "item_id": item,
            "category": item % 7,
            "price": price,
            "age": rng.normal(size=rows).astype(np.float32),
            "clicked": label,
        }
    )


def _dense(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def _local_tables(stepper) -> dict[str, torch.Tensor]:
    """This rank's shards of every table (ShardedTensor local shards)."""
    out = {}
    for name, value in stepper.dmp.state_dict().items():
        if "embedding_bags" in name and hasattr(value, "local_shards"):
            for k, shard in enumerate(value.local_shards()):
                out[f"{name}#{k}"] = shard.tensor.detach().clone()
    return out


def _full_state(stepper) -> dict | None:
    """Rank 0: every table whole (table_wise: a rank's local shard is the table) and the towers."""
    tables = {}
    for name, value in stepper.dmp.state_dict().items():
        if "embedding_bags" in name:
            shard = value.local_shards()
            if shard:
                tables[name] = shard[0].tensor.detach().clone()
    gathered: list | None = [None, None] if dist.get_rank() == 0 else None
    dist.gather_object(tables, gathered, dst=0)
    if gathered is None:
        return None
    return {"tables": {k: v for part in gathered for k, v in part.items()}, "dense": _dense(stepper.dense_parameters())}


def _eval_loss(stepper, batch, output: str) -> float:
    probs = torch.from_numpy(stepper.predict(batch, output)).clamp(1e-7, 1 - 1e-7)
    return float(torch.nn.functional.binary_cross_entropy(probs, batch.labels))


def _worker(rank: int, store: str, spec: str, out: str, body) -> None:
    """One gloo rank of two running ``body(rank, job, out)``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        body(rank, load_job(spec), Path(out))
    finally:
        dist.destroy_process_group()


def _rank_batch(rng: np.random.Generator, rank: int, step: int, features):
    """This rank's half of the step's global minibatch and the global row count; at ``EMPTY_STEP``
    rank 1 has no rows (it joins with a weight-0 dummy row)."""
    mine = _table(rng, ROWS).take(list(range(rank, ROWS, 2)))
    if step == EMPTY_STEP:
        return (None if rank == 1 else to_batch(mine, features)), ROWS // 2
    return to_batch(mine, features), ROWS


def _run(rank: int, job, out: Path) -> None:
    from primus_lib.train.distributed.sharded import ShardedStepper, table_placement

    features = job.spec.features
    stepper = ShardedStepper(job)
    model = stepper.model
    report: dict = {"placement": table_placement(stepper.dmp), "violations": [], "table_moves": []}
    rng = np.random.default_rng(11)  # the same global data on every rank
    evaluation = to_batch(_table(np.random.default_rng(99), 128).take(list(range(rank, 128, 2))), features)
    initial = _full_state(stepper)
    report["before"] = {o: _eval_loss(stepper, evaluation, o) for o in ("memory", "adapt", "reread")}
    for step, kind in enumerate(KINDS):
        batch, global_rows = _rank_batch(rng, rank, step, features)
        memory, adapt, reread, tables = (
            _dense(model.memory_parameters()),
            _dense(model.adapt_parameters()),
            _dense(model.reread_parameters()),
            _local_tables(stepper),
        )
        result = stepper.step(kind, batch, global_rows)
        if (result is None) != (batch is None):
            report["violations"].append(f"step {step}: result {result} for batch {batch is not None}")
        adapt_moved = not all(torch.equal(a, b) for a, b in zip(adapt, model.adapt_parameters(), strict=True))
        memory_moved = not all(torch.equal(a, b) for a, b in zip(memory, model.memory_parameters(), strict=True))
        reread_moved = not all(torch.equal(a, b) for a, b in zip(reread, model.reread_parameters(), strict=True))
        if adapt_moved != (kind == "stream") or not memory_moved or not reread_moved:
            report["violations"].append(
                f"step {step}: {kind} step moved adapt {adapt_moved}, memory {memory_moved}, reread {reread_moved}"
            )
        after = _local_tables(stepper)
        for prefix in ("t_", "fresh_", "reread_"):  # the shared tables, the adapt tower's own, the reread tower's
            moved = any(not torch.equal(tables[k], after[k]) for k in tables if f".{prefix}" in k)
            report["table_moves"].append([kind, prefix, moved])
    report["after"] = {o: _eval_loss(stepper, evaluation, o) for o in ("memory", "adapt", "reread")}
    torch.save({"dense": _dense(stepper.dense_parameters())}, out / f"dense{rank}.pt")
    final = _full_state(stepper)
    if rank == 0:
        torch.save({"initial": initial, "final": final}, out / "states.pt")

    # Checkpoints wired as the trainer would: every rank calls checkpoint_state, rank 0 commits the
    # reference with save_checkpoint. Step 24's model is never committed (a kill in between).
    root = out / "checkpoints"
    stepper.checkpoint_root = root
    names = []
    for step in (23, 24, 25):
        state = stepper.checkpoint_state(step)
        names.append(Path(state["sharded_model"]).name)
        if rank == 0 and step != 24:
            save_checkpoint(root, step, state, {"world_size": 2}, {})
        dist.barrier()
    report["models"] = sorted(p.name for p in (root / "sharded").iterdir())
    report["expected_models"] = sorted([names[0], names[2]])  # the orphan was pruned, the committed kept
    fresh = ShardedStepper(job, seed=123, checkpoint_root=root)
    report["fresh_differs"] = not np.array_equal(
        fresh.predict(evaluation, "adapt"), stepper.predict(evaluation, "adapt")
    )
    latest = load_latest(root)
    fresh.load_state_dict(latest.state)
    report["meta_step"] = json.loads((root / latest.state["sharded_model"] / "meta.json").read_text())["step"]
    report["same_outputs"] = all(
        np.array_equal(fresh.predict(evaluation, o), stepper.predict(evaluation, o))
        for o in ("memory", "adapt", "reread")
    )
    # Optimizer states came back too: one more step on each model gives the same model.
    table = _table(rng, ROWS).take(list(range(rank, ROWS, 2)))
    for s in (stepper, fresh):
        s.step("batch", to_batch(table, features), ROWS)
    report["same_after_step"] = all(
        np.array_equal(fresh.predict(evaluation, o), stepper.predict(evaluation, o)) for o in ("memory", "adapt")
    ) and all(
        torch.equal(a, b) for a, b in zip(_local_tables(fresh).values(), _local_tables(stepper).values(), strict=True)
    )
    (out / f"report{rank}.json").write_text(json.dumps(report))


@pytest.fixture
def spec_file(tmp_path, monkeypatch) -> str:
    return str(write_job(tmp_path, monkeypatch, job_doc()))


def test_sharded_two_ranks(spec_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(tmp_path / "store"), spec_file, str(out), _run), nprocs=2, join=True)
    reports = [json.loads((out / f"report{r}.json").read_text()) for r in range(2)]
    r0 = reports[0]

    # table_wise: each table whole on one rank, and both ranks hold some table.
    placement = r0["placement"]
    prefixes = ("t_", "fresh_", "reread_")
    assert set(placement) == {f"{p}{f}" for p in prefixes for f in ("user_id", "item_id", "category")}
    assert all(kind == "table_wise" and len(ranks) == 1 for shards in placement.values() for kind, ranks in shards)
    assert {ranks[0] for shards in placement.values() for _, ranks in shards} == {0, 1}
    assert reports[1]["placement"] == placement

    for report in reports:
        assert report["violations"] == []
    moves = {(kind, prefix) for r in reports for kind, prefix, moved in r["table_moves"] if moved}
    # both kinds move the shared and reread tables (on the rank that owns a touched row); only stream steps the fresh
    assert moves == {(k, p) for k in ("batch", "stream") for p in ("t_", "reread_")} | {("stream", "fresh_")}

    d0 = torch.load(out / "dense0.pt")["dense"]
    d1 = torch.load(out / "dense1.pt")["dense"]
    assert all(torch.equal(a, b) for a, b in zip(d0, d1, strict=True))  # towers identical on both ranks

    for report in reports:  # learnable data: both graphs' held-out loss falls
        assert report["after"]["memory"] < report["before"]["memory"] - 0.02, report
        assert report["after"]["adapt"] < report["before"]["adapt"] - 0.02, report
        assert report["after"]["reread"] < report["before"]["reread"] - 0.02, report

    for report in reports:
        assert report["models"] == report["expected_models"] and len(report["models"]) == 2
        assert report["fresh_differs"] and report["meta_step"] == 25
        assert report["same_outputs"] and report["same_after_step"]

    model_dir = out / "checkpoints" / "sharded" / reports[0]["models"][-1]
    meta = json.loads((model_dir / "meta.json").read_text())
    assert (
        meta["world_size"] == 2
        and meta["mode"] == "mtrm"
        and meta["plan"] == {t: [list(p) for p in shards] for t, shards in reports[0]["placement"].items()}
    )
    assert (model_dir / ".metadata").is_file() and len(list(model_dir.glob("*.distcp"))) == 2  # one file per rank
    assert not [p for p in (out / "checkpoints" / "sharded").iterdir() if p.name.startswith(".")]  # no staging left


def _run_steps(rank: int, job, out: Path) -> None:
    """MATCH_STEPS steps of the default config, recording whether the tables moved at each."""
    from primus_lib.train.distributed.sharded import ShardedStepper

    stepper = ShardedStepper(job)
    initial, rng, moves = _full_state(stepper), np.random.default_rng(11), []
    for step, kind in enumerate(KINDS[:MATCH_STEPS]):
        batch, global_rows = _rank_batch(rng, rank, step, job.spec.features)
        tables = _local_tables(stepper)
        stepper.step(kind, batch, global_rows)
        after = _local_tables(stepper)
        moves.append([kind, any(not torch.equal(tables[k], after[k]) for k in tables)])
    final = _full_state(stepper)
    (out / f"steps{rank}.json").write_text(json.dumps({"moves": moves}))
    if rank == 0:
        torch.save({"initial": initial, "final": final}, out / "states.pt")


def test_sharded_two_ranks_match_one_process(spec_file, tmp_path):
    """The sharded pair equals one replicated process stepping the union of both halves, a zero-row
    rank in a stream step included (step 3)."""
    out = tmp_path / "out"
    out.mkdir()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(tmp_path / "store"), spec_file, str(out), _run_steps), nprocs=2, join=True)
    reports = [json.loads((out / f"steps{r}.json").read_text()) for r in range(2)]
    for kind in ("batch", "stream"):  # both kinds move some table somewhere
        assert any(moved for r in reports for k, moved in r["moves"] if k == kind)
    _check_matches_one_process(spec_file, out, steps=MATCH_STEPS)


def _check_matches_one_process(spec_file: str, out: Path, steps: int, table_atol: float = 1e-4) -> None:
    """The sharded pair equals one replicated process stepping the union of both halves from the
    same weights (towers and tables, to 1e-4 after ``steps`` steps: float summation order differs)."""
    from primus_lib.train.distributed.group import Group
    from primus_lib.train.model.stepper import LocalStepper

    job = load_job(spec_file)
    states = torch.load(out / "states.pt", weights_only=False)
    single = LocalStepper(job, tables="replicated")
    model = single.model
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    # The fused kernel's row-wise Adagrad uses eps 1e-8 (torchrec's RowWiseAdagrad defaults to 1e-10).
    single.sparse = RowWiseAdagrad(model.table_parameters(), lr=job.spec.training.sparse_learning_rate, eps=1e-8)
    with torch.no_grad():
        for param, value in zip(model.dense_parameters(), states["initial"]["dense"], strict=True):
            param.copy_(value)
        tables = model.state_dict()
        assert set(states["initial"]["tables"]) == {k for k in tables if "embedding_bags" in k}
        for name, value in states["initial"]["tables"].items():
            tables[name].copy_(value)
    rng = np.random.default_rng(11)
    for step, kind in enumerate(KINDS[:steps]):
        table = _table(rng, ROWS)
        if step == EMPTY_STEP:
            table = table.take(list(range(0, ROWS, 2)))  # rank 1 had no rows
        single.step(kind, to_batch(table, job.spec.features), table.num_rows, Group())
    final = states["final"]
    h_aux = model.adapt_parameters()[0]  # its last input column reads the memory logit
    for param, value in zip(model.dense_parameters(), final["dense"], strict=True):
        if param is h_aux:
            # the h_aux weight's first gradients are near Adam's eps (the memory logit starts near 0), where
            # float summation order moves a normalised step by more: 5e-4 there (seen 1.5e-4), 1e-4 elsewhere
            assert torch.allclose(param[:, -1], value[:, -1], atol=5e-4), (param[:, -1] - value[:, -1]).abs().max()
            param, value = param[:, :-1], value[:, :-1]
        assert torch.allclose(param, value, atol=1e-4), (param - value).abs().max()
    state = model.state_dict()
    for name, value in final["tables"].items():
        assert not torch.equal(value, states["initial"]["tables"][name]), name  # trained
        # a row-wise Adagrad step is normalised: a weight whose gradients are near 0 moves by their sign, where
        # float summation order differs (one weight of 16,000 by 1.7e-4 when the tables are drawn otherwise):
        # at most one in a thousand past ``table_atol``, none past 5x it
        off = (state[name] - value).abs()
        assert float(off.max()) < 5 * table_atol and int((off > table_atol).sum()) <= off.numel() // 1000, (
            name,
            float(off.max()),
            int((off > table_atol).sum()),
        )


def test_sharding_choice_and_types(spec_file):
    """``spec.training.sharding`` picks the stepper; CUDA-only sharding types are refused on the CPU."""
    from primus_lib.train.distributed.group import Group
    from primus_lib.train.distributed.sharded import sharding_types
    from primus_lib.train.model.objective import StepConfig
    from primus_lib.train.model.stepper import LocalStepper, make_stepper

    cpu = torch.device("cpu")
    assert sharding_types(cpu) == ("table_wise",)
    assert "row_wise" in sharding_types(torch.device("cuda"))
    assert sharding_types(cpu, ["table_wise", "column_wise"]) == ("table_wise", "column_wise")
    with pytest.raises(ValueError, match="need CUDA kernels"):
        sharding_types(cpu, ["row_wise"])
    from primus_lib.spec.errors import SpecError

    with pytest.raises(SpecError, match="sharding_types"):
        load_written(job_doc(sharding_types=["data_parallel"]), spec_file)
    with pytest.raises(SpecError, match="sharding"):
        load_written(job_doc(sharding="bogus"), spec_file)
    job = load_written(job_doc(sharding="dmp"), spec_file)
    stepper = make_stepper(job, StepConfig.resolve(job), Group())  # not under torchrun: nothing to shard across
    assert type(stepper) is LocalStepper and stepper.model.tables == "fused"
    # (under torchrun, dmp shards in a world of one too: scripts/gpu_train_check.py, tests/scripts)


def test_a_trainer_with_gpus_shards_its_tables_by_default(spec_file):
    """Only the sharded model goes to a GPU: a GPU trainer left at the default would train on its CPU."""
    from primus_lib.spec.errors import SpecError
    from primus_lib.train.model.stepper import table_sharding

    gpu = {"trainer": {"replicas": 1, "cpu": 1, "memory": "1Gi", "gpu": 1}}
    assert table_sharding(load_written(job_doc(), spec_file)) == "replicate"
    assert table_sharding(load_written(job_doc(roles=gpu), spec_file)) == "dmp"
    with pytest.raises(SpecError, match="spec.training.sharding: expected dmp or no setting for a trainer with GPUs"):
        load_written(job_doc(roles=gpu, sharding="replicate"), spec_file)  # GPUs held that would never be used
    assert table_sharding(load_written(job_doc(sharding="dmp"), spec_file)) == "dmp"


def load_written(doc: dict, path: str):
    return load_job(write_spec(Path(path), doc))


def _run_s3(rank: int, job, out: Path) -> None:
    """Train a few steps, checkpoint to S3 as the trainer does (model 1 committed, model 2 never
    named: a kill in between, model 3 committed), then a fresh pair resumes from S3 alone."""
    from primus_lib.paths import JobPaths
    from primus_lib.train.distributed.sharded import ShardedStepper

    features = job.spec.features
    root = JobPaths.for_job(job).checkpoints  # s3://bucket/jobs/<job>/trainer/checkpoints
    stepper = ShardedStepper(job, checkpoint_root=root)
    rng = np.random.default_rng(5)
    evaluation = to_batch(_table(np.random.default_rng(99), 64).take(list(range(rank, 64, 2))), features)
    for _ in range(4):
        stepper.step("batch", to_batch(_table(rng, ROWS).take(list(range(rank, ROWS, 2))), features), ROWS)
    names = []
    for step in (4, 5, 6):
        state = stepper.checkpoint_state(step)
        names.append(Path(state["sharded_model"]).name)
        if rank == 0 and step != 5:
            save_checkpoint(root, step, state, {"world_size": 2}, {})
        dist.barrier()
    models = root / "sharded"
    report: dict = {
        "root": str(root),
        "models": sorted(e.name for e in models.list()),
        "expected": [names[0], names[2]],
    }
    latest = load_latest(root)  # the resume: only what is on S3
    meta = json.loads((root / latest.state["sharded_model"] / "meta.json").read_text())
    report["meta"] = {"step": meta["step"], "world_size": meta["world_size"], "files": sorted(meta["files"])}
    fresh = ShardedStepper(job, seed=321, checkpoint_root=root)
    report["fresh_differs"] = not np.array_equal(
        fresh.predict(evaluation, "memory"), stepper.predict(evaluation, "memory")
    )
    fresh.load_state_dict(latest.state)
    report["same_outputs"] = all(
        np.array_equal(fresh.predict(evaluation, o), stepper.predict(evaluation, o)) for o in ("memory", "adapt")
    )
    table = _table(rng, ROWS).take(list(range(rank, ROWS, 2)))
    for s in (stepper, fresh):  # the optimizers came back too: one more step gives the same model
        s.step("batch", to_batch(table, features), ROWS)
    report["same_after_step"] = all(
        torch.equal(a, b) for a, b in zip(_local_tables(fresh).values(), _local_tables(stepper).values(), strict=True)
    ) and np.array_equal(fresh.predict(evaluation, "memory"), stepper.predict(evaluation, "memory"))
    (out / f"report{rank}.json").write_text(json.dumps(report))


@pytest.mark.integration
def test_sharded_checkpoints_on_s3_two_ranks_resume(spec_file, tmp_path, s3_env):
    """DCP shards of two gloo ranks on S3 (SeaweedFS, no s3fs): staged locally, uploaded, meta.json
    last; an uncommitted model is pruned; a fresh pair resumes from the S3 checkpoint alone."""
    import uuid

    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(bucket)
    spec = Path(spec_file)
    text = spec.read_text()
    spec.write_text(text + f'  storage: {{root: "s3://{bucket}/jobs"}}\n')
    out = tmp_path / "out"
    out.mkdir()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(tmp_path / "store"), spec_file, str(out), _run_s3), nprocs=2, join=True)
    reports = [json.loads((out / f"report{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["root"].startswith(f"s3://{bucket}/jobs/")
        assert report["models"] == sorted(report["expected"])  # the orphan model was pruned
        assert report["meta"]["step"] == 6 and report["meta"]["world_size"] == 2
        assert report["meta"]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "dense_optimizers.pt"]
        assert report["fresh_differs"] and report["same_outputs"] and report["same_after_step"]
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").rglob("*.distcp"))  # nothing local


def test_a_sharded_model_of_three_collections_is_refused_in_one_line():
    """A DCP model saved while MTRM's fresh and reread tables were collections of their own names them
    there; this model has no such weights, so the load stops before DCP reads anything."""
    from types import SimpleNamespace

    from primus_lib.train.checkpoint.sharded import _check_layout

    current = {"model.embeddings.embedding_bags.fresh_user_id.weight": None, "model.memory.0.weight": None}
    _check_layout(SimpleNamespace(state_dict_metadata=current), "ckpt")  # today's layout: loads
    old = {**current, "model.reread_tables.embedding_bags.reread_user_id.weight": None}
    with pytest.raises(ValueError, match=r"^ckpt: a sharded MTRM model saved before its tables were one collection"):
        _check_layout(SimpleNamespace(state_dict_metadata=old), "ckpt")
