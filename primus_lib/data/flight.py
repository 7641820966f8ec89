"""Arrow Flight in front of a sample buffer, so a trainer on another host pulls rows remotely.

``DoGet`` with ticket ``rows=N`` pops up to N rows (an empty stream when none arrived within
the server's wait); ``DoAction('stats')`` returns the buffer's length and utilisation. A
*tagged* server (the stream executor, ``executor/service.py``) adds two columns to every batch
it hands out: ``__partition`` (dictionary-encoded ``topic/partition``) and ``__offset`` (the
row's source offset), so the puller knows exactly which offsets it holds; further actions
(``commit``, ``seek``, ...) take and return one JSON object each. A server with *lanes* (a
stream executor in rebalance mode) also takes ``rows=N;lane=R``: rows of lane R (trainer rank R).
A server given a ``pop`` hands tagged rows out through it (a stream executor's leases); ``ack``
(release what the reader holds) answers ``{"released": 0}`` on a server without leases. A server
given a ``Credential`` refuses every call without the job's token (``flight_auth.py``); the client
sends it with each call.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from primus_lib.data.buffer import SampleBuffer
from primus_lib.data.flight_auth import Credential, TokenCheck, call_headers

PARTITION_COLUMN = "__partition"
OFFSET_COLUMN = "__offset"
Action = Callable[[dict], dict]
LanePop = Callable[[int, int, float], "tuple[pa.RecordBatch, list[str], np.ndarray] | None"]
Pop = Callable[[int, float], "tuple[pa.RecordBatch, list[str], np.ndarray] | None"]


def tag(batch: pa.RecordBatch, keys: list[str], offsets: np.ndarray) -> pa.RecordBatch:
    """``batch`` with the partition and offset of each row as two trailing columns."""
    if keys and keys[0] == keys[-1] and len(set(keys)) == 1:
        names, indices = [keys[0]], np.zeros(len(keys), np.int32)
    else:
        unique, inverse = np.unique(np.asarray(keys, dtype=object), return_inverse=True)
        names, indices = unique.tolist(), inverse.astype(np.int32)
    partition = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(names, pa.string()))
    columns = [*batch.columns, partition, pa.array(offsets, pa.int64())]
    return pa.RecordBatch.from_arrays(columns, schema=tagged_schema(batch.schema))


def tagged_schema(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(PARTITION_COLUMN, pa.dictionary(pa.int32(), pa.string()))).append(
        pa.field(OFFSET_COLUMN, pa.int64())
    )


def untag(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[str], np.ndarray]:
    """Split a tagged batch into the samples, the partition of each row and its offset."""
    partition = batch.column(batch.num_columns - 2)
    offsets = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
    if isinstance(partition, pa.DictionaryArray):
        names = partition.dictionary.to_pylist()
        indices = partition.indices.to_numpy(zero_copy_only=False)
        keys = [names[0]] * len(indices) if len(names) == 1 else [names[i] for i in indices]
    else:
        keys = partition.to_pylist()
    samples = pa.RecordBatch.from_arrays(batch.columns[:-2], schema=pa.schema(list(batch.schema)[:-2]))
    return samples, keys, offsets


class BufferFlightServer(flight.FlightServerBase):
    def __init__(
        self,
        buffer: SampleBuffer,
        schema: pa.Schema,
        location: str = "grpc://127.0.0.1:0",
        wait: float = 1.0,
        *,
        tagged: bool = False,
        actions: dict[str, Action] | None = None,
        lanes: LanePop | None = None,
        pop: Pop | None = None,
        credential: Credential | None = None,
    ):
        self.auth = None if credential is None else TokenCheck(credential)
        super().__init__(location, middleware={} if self.auth is None else {"auth": self.auth})
        self.buffer, self.schema, self.wait = buffer, schema, wait
        self.tagged, self.actions, self.lanes, self.pop = tagged, dict(actions or {}), lanes, pop

    def do_get(self, context, ticket: flight.Ticket):
        text = ticket.ticket.decode()
        fields = dict(part.partition("=")[::2] for part in text.split(";"))
        if "rows" not in fields or set(fields) - {"rows", "lane"}:
            raise flight.FlightServerError(f"ticket {text!r}: expected 'rows=<n>' or 'rows=<n>;lane=<r>'")
        try:
            rows, lane = int(fields["rows"]), int(fields.get("lane", -1))
        except ValueError:
            raise flight.FlightServerError(f"ticket {text!r}: expected integers in 'rows=<n>;lane=<r>'") from None
        if "lane" in fields:
            if self.lanes is None:
                raise flight.FlightServerError(f"ticket {text!r}: this server has no lanes (shuffle is not rebalance)")
            try:
                popped = self.lanes(lane, rows, self.wait)
            except ValueError as exc:
                raise flight.FlightServerError(f"ticket {text!r}: {exc}") from None
            batch = None if popped is None else tag(*popped)
            schema = tagged_schema(self.schema)
        elif self.tagged:
            popped = self.pop(rows, self.wait) if self.pop else self.buffer.pop_tagged(rows, timeout=self.wait)
            batch = None if popped is None else tag(*popped)
            schema = tagged_schema(self.schema)
        else:
            batch = self.buffer.pop(rows, timeout=self.wait)
            schema = self.schema
        if batch is None:
            return flight.RecordBatchStream(pa.Table.from_batches([], schema=schema))
        return flight.RecordBatchStream(pa.Table.from_batches([batch], schema=batch.schema))

    def do_action(self, context, action: flight.Action):
        body = json.loads(action.body.to_pybytes() or b"{}") if action.body is not None else {}
        if action.type == "stats":
            out = {"rows": len(self.buffer), "utilisation": self.buffer.utilisation, "rows_out": self.buffer.rows_out}
            if "stats" in self.actions:
                out.update(self.actions["stats"](body))
        elif action.type == "ack" and "ack" not in self.actions:
            out = {"released": 0}  # no leases: rows left with the DoGet
        elif action.type in self.actions:
            try:
                out = self.actions[action.type](body)
            except Exception as exc:
                raise flight.FlightServerError(f"action {action.type!r}: {type(exc).__name__}: {exc}") from exc
        else:
            raise flight.FlightServerError(f"unknown action {action.type!r}")
        yield flight.Result(json.dumps(out).encode())


class FlightBufferClient:
    """The trainer side: pops rows from a remote sample buffer (with the job's ``token``, if given)."""

    def __init__(self, location: str, timeout: float | None = None, token: str | None = None):
        self.location = location
        self.client = flight.connect(location)
        self.options = flight.FlightCallOptions(timeout=timeout, headers=call_headers(token))

    def _call(self):
        return {"options": self.options}

    def pop(self, rows: int, lane: int | None = None) -> pa.RecordBatch | None:
        ticket = f"rows={rows}" if lane is None else f"rows={rows};lane={lane}"
        table = self.client.do_get(flight.Ticket(ticket.encode()), **self._call()).read_all()
        if table.num_rows == 0:
            return None
        return table.combine_chunks().to_batches()[0]

    def pop_tagged(self, rows: int, lane: int | None = None) -> tuple[pa.RecordBatch, list[str], np.ndarray] | None:
        """Rows of a tagged server with the partition and offset of each (of lane ``lane``)."""
        batch = self.pop(rows, lane)
        return None if batch is None else untag(batch)

    def action(self, name: str, body: dict | None = None) -> dict:
        payload = json.dumps(body or {}).encode()
        result = next(iter(self.client.do_action(flight.Action(name, payload), **self._call())))
        return json.loads(result.body.to_pybytes())

    def stats(self) -> dict:
        return self.action("stats")

    def close(self) -> None:
        self.client.close()
