"""torchrun support: the process group and the collectives the data-parallel trainer needs.

Under ``torchrun --nproc-per-node N primus train SPEC`` every rank runs the same trainer on
its own part of the data (``ranks.py``) with a replica of the model. Each iteration the
ranks all-reduce one small control vector (buffer fill, flags), from which every rank
derives the same decision (step or not, which stream, checkpoint, stop); a step all-reduces
the gradients of exactly the parameters that step updates, so Algorithm 1's separation
holds on every rank. CPU tensors go over gloo; with CUDA the group is ``cpu:gloo,cuda:nccl``
(the control vector stays on the CPU; a sharded model's tables and towers live on each rank's
GPU; nccl has run with one rank only: docs/status.md).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

import pyarrow as pa
import torch
import torch.distributed as dist

T = TypeVar("T")  # what a collective ships (pickled): every rank gets the same type back


def world() -> tuple[int, int]:
    """(rank, world size) of this process: the process group's, else a world of one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launched_by_torchrun() -> bool:
    return dist.is_available() and dist.is_torchelastic_launched()


def maybe_init_distributed(timeout: timedelta = timedelta(minutes=30)) -> None:
    """Start the process group when launched by torchrun (gloo for CPU tensors, nccl for CUDA ones);
    ``timeout`` bounds every collective (``spec.training.collective_timeout``)."""
    if not launched_by_torchrun() or dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=timeout)


class Group:
    """The collectives of a data-parallel trainer; a world of one makes every call local."""

    def __init__(self) -> None:
        if launched_by_torchrun() and not dist.is_initialized():
            raise RuntimeError("launched by torchrun but no process group: start it first (maybe_init_distributed)")
        self.rank, self.size = world()
        self.active = self.size > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64: exact for counts below 2**53)."""
        if not self.active:  # every step asks: no tensor for a world of one
            return [float(v) for v in values]
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks."""
        if not self.active:
            return [float(v) for v in values]
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def reduce_grads(self, params: list[torch.nn.Parameter], tables: Sequence[torch.nn.Parameter] = ()) -> None:
        """Sum the gradients of ``params`` and of the embedding ``tables`` over ranks (missing = zero).

        Tables send only the rows some rank has a gradient for: one all-reduce of a row mask,
        then one flat all-reduce of the towers' gradients and those rows. Rows nobody touched
        keep a zero gradient (row-wise Adagrad leaves them as they are).
        """
        if not self.active or not (params or tables):
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in [*params, *tables]]
        table_grads = grads[len(params) :]
        rows = []
        if table_grads:
            mask = torch.cat([(g != 0).any(dim=1) for g in table_grads]).to(torch.uint8)
            dist.all_reduce(mask, op=dist.ReduceOp.MAX)
            offset = 0
            for g in table_grads:
                rows.append(mask[offset : offset + g.shape[0]].nonzero().squeeze(1))
                offset += g.shape[0]
        parts = [g.reshape(-1) for g in grads[: len(params)]] + [
            g[r].reshape(-1) for g, r in zip(table_grads, rows, strict=True)
        ]
        flat = torch.cat(parts)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for param in params:
            n = param.numel()
            param.grad = flat[offset : offset + n].view_as(param).clone()
            offset += n
        for table, r in zip(tables, rows, strict=True):
            n = r.numel() * table.shape[1]
            grad = torch.zeros_like(table)
            grad[r] = flat[offset : offset + n].view(r.numel(), table.shape[1])
            table.grad = grad
            offset += n

    def all_gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's 1-d ``values`` (lengths may differ), in rank order, on every rank."""
        if not self.active:
            return [values]
        size = torch.tensor([values.numel()], dtype=torch.int64)
        sizes = [torch.zeros_like(size) for _ in range(self.size)]
        dist.all_gather(sizes, size)
        longest = max(int(n) for n in sizes)
        padded = torch.zeros(longest, dtype=values.dtype)
        padded[: values.numel()] = values
        out = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(out, padded)
        return [t[: int(n)] for t, n in zip(out, sizes, strict=True)]

    def max_tensor(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum of a tensor over ranks (in place; returned)."""
        if self.active:
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values

    def broadcast_params(self, module: torch.nn.Module) -> None:
        """Make every rank start from rank 0's weights."""
        if self.active:
            for tensor in module.state_dict().values():
                if isinstance(tensor, torch.Tensor):
                    dist.broadcast(tensor, src=0)

    def gather(self, obj: T) -> list[T] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        if not self.active:
            return [obj]
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None  # filled by gather_object
        dist.gather_object(obj, out, dst=0)
        return out

    def scatter(self, objs: list[T] | None) -> T | None:
        """Rank 0's ``objs[r]`` on rank r."""
        if not self.active:
            return objs[0] if objs else None
        out: list[T | None] = [None]
        dist.scatter_object_list(out, objs if self.rank == 0 else None, src=0)
        return out[0]

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box: list[Any] = [obj if self.rank == 0 else None]  # rank 0's obj in its place after the collective
        dist.broadcast_object_list(box, src=0)
        return box[0]


def table_bytes(table: pa.Table | None) -> bytes | None:
    """An Arrow table as IPC bytes (to ship pending rows to rank 0)."""
    if table is None or table.num_rows == 0:
        return None
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def bytes_table(raw: bytes | None) -> pa.Table | None:
    return None if raw is None else pa.ipc.open_stream(raw).read_all()
