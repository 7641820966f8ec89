"""Decode JSON messages (Kafka values, JSONL lines) into samples; bad ones are set aside, not lost.

The fast path parses a whole block at once with Arrow's JSON reader; if the block has a bad
message the block is redone message by message so each bad one gets its own reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from primus_lib.data.sources.decode import DecodeError, column_map, decode, required_columns
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob

MAX_MESSAGE_BYTES = 1 << 20  # one sample; Arrow's JSON reader would need a block this large


@dataclass(frozen=True)
class Malformed:
    index: int  # position in the block
    reason: str


def decode_messages(
    job: PrimusJob, stream: StreamSpec, source: SourceSpec, values: list[bytes], origin: str
) -> tuple[pa.Table, list[int], list[Malformed]]:
    """-> (samples of the good messages, their indexes in ``values``, the malformed ones)."""
    mapping = column_map(job, source)
    required = [mapping.get(c, c) for c in required_columns(job, stream, source)]
    oversized = (
        {i for i, value in enumerate(values) if len(value) > MAX_MESSAGE_BYTES}
        if max(map(len, values), default=0) > MAX_MESSAGE_BYTES
        else set()
    )
    if not oversized:
        try:
            return _block(job, stream, source, values, origin, required)
        except (pa.ArrowInvalid, DecodeError, _Mismatch):
            pass
    tables, good, bad = [], [], []
    for i, value in enumerate(values):
        if i in oversized:  # never parsed: a sample is a small object, this is a producer bug or an attack
            bad.append(Malformed(i, f"oversized: {len(value)} bytes, more than {MAX_MESSAGE_BYTES}"))
            continue
        try:
            table, _, errors = _block(job, stream, source, [value], f"{origin} message {i}", required)
        except (pa.ArrowInvalid, DecodeError, _Mismatch) as exc:
            bad.append(Malformed(i, _reason(value, exc)))
            continue
        if errors:
            bad.append(Malformed(i, errors[0].reason))
        else:
            tables.append(table)
            good.append(i)
    if not tables:
        return _empty(job, stream, source, origin), good, bad
    return pa.concat_tables(tables, promote_options="permissive"), good, bad


class _Mismatch(ValueError):
    pass


def _block(job, stream, source, values: list[bytes], origin: str, required: list[str]):
    body = b"\n".join(values)
    if body.count(b"\n") != len(values) - 1 or b"\r" in body:  # a message's own line breaks: one line each
        body = b"\n".join(v.replace(b"\n", b" ").replace(b"\r", b" ") for v in values)
    raw = pajson.read_json(pa.BufferReader(body), read_options=pajson.ReadOptions(use_threads=False))
    if raw.num_rows != len(values):
        raise _Mismatch(f"{len(values)} messages gave {raw.num_rows} rows")
    bad: list[Malformed] = []
    missing = [c for c in required if c not in raw.column_names]
    if missing:
        if len(values) > 1:
            raise _Mismatch("missing columns")
        return None, [], [Malformed(0, f"missing required field(s) {missing}")]
    mask = None
    for name in required:
        nulls = pc.is_null(raw.column(name))
        mask = nulls if mask is None else pc.or_(mask, nulls)
    good_idx = list(range(len(values)))
    if mask is not None and pc.any(mask).as_py():
        flags = mask.to_pylist()
        bad = [Malformed(i, f"null or missing required field among {required}") for i, f in enumerate(flags) if f]
        good_idx = [i for i, f in enumerate(flags) if not f]
        raw = raw.filter(pc.invert(mask))
    return decode(job, stream, source, raw, origin), good_idx, bad


def _empty(job, stream, source, origin) -> pa.Table:
    from primus_lib.data.schema import job_keys, sample_schema

    schema = sample_schema(job.spec.features, job_keys(job))
    return schema.empty_table()


def _reason(value: bytes, exc: Exception) -> str:
    try:
        parsed = json.loads(value)
    except (ValueError, UnicodeDecodeError) as err:
        return f"not JSON: {err}"
    if not isinstance(parsed, dict):
        return f"expected a JSON object, found {type(parsed).__name__}"
    return str(exc).splitlines()[0][:500]
