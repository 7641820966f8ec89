"""Arrow Flight in front of a sample buffer, so a trainer on another host pulls rows remotely.

``DoGet`` with ticket ``rows=N`` pops up to N rows (an empty stream when none arrived within
the server's wait); ``DoAction('stats')`` returns the buffer's length and utilisation.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight

from primus_lib.data.buffer import SampleBuffer


class BufferFlightServer(flight.FlightServerBase):
    def __init__(
        self, buffer: SampleBuffer, schema: pa.Schema, location: str = "grpc://127.0.0.1:0", wait: float = 1.0
    ):
        super().__init__(location)
        self.buffer, self.schema, self.wait = buffer, schema, wait

    def do_get(self, context, ticket: flight.Ticket):
        text = ticket.ticket.decode()
        if not text.startswith("rows="):
            raise flight.FlightServerError(f"ticket {text!r}: expected 'rows=<n>'")
        try:
            rows = int(text[5:])
        except ValueError:
            raise flight.FlightServerError(f"ticket {text!r}: expected 'rows=<n>' with an integer n") from None
        batch = self.buffer.pop(rows, timeout=self.wait)
        batches = [] if batch is None else [batch]
        return flight.RecordBatchStream(
            pa.Table.from_batches(batches, schema=batch.schema if batch is not None else self.schema)
        )

    def do_action(self, context, action: flight.Action):
        if action.type != "stats":
            raise flight.FlightServerError(f"unknown action {action.type!r}")
        body = {"rows": len(self.buffer), "utilisation": self.buffer.utilisation, "rows_out": self.buffer.rows_out}
        yield flight.Result(json.dumps(body).encode())


class FlightBufferClient:
    """The trainer side: pops rows from a remote sample buffer."""

    def __init__(self, location: str):
        self.client = flight.connect(location)

    def pop(self, rows: int) -> pa.RecordBatch | None:
        table = self.client.do_get(flight.Ticket(f"rows={rows}".encode())).read_all()
        if table.num_rows == 0:
            return None
        return table.combine_chunks().to_batches()[0]

    def stats(self) -> dict:
        result = next(iter(self.client.do_action(flight.Action("stats", b""))))
        return json.loads(result.body.to_pybytes())

    def close(self) -> None:
        self.client.close()
