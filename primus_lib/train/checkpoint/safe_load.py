"""Reading torch files from shared storage without running their code.

A checkpoint on S3/HDFS is written by whoever can write the bucket; unpickling it would run their
code in the trainer. Every torch file Primus reads back goes through ``load_torch``:
``torch.load(weights_only=True)`` builds tensors, numbers, strings and containers only, and a file
that holds anything else (a pickled callable, a class) is refused with ``UnsafeCheckpointError``,
one line naming the file; nothing in it runs. DCP's ``.metadata`` pickle has its own guard
(``safe_dcp.py``).
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

_REASON = re.compile(r"(unsupported GLOBAL \S+|Unsupported global: GLOBAL \S+|Unsupported operand \d+)", re.I)


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that holds more than plain data (it would run code if unpickled)."""


def load_torch(source: Path | bytes, shown: object | None = None) -> Any:
    """``torch.load`` of a file (or its bytes) with ``weights_only=True``; ``shown`` names it in errors."""
    import torch  # here: the CLI imports this module for its error class

    where = shown if shown is not None else source
    try:
        return torch.load(io.BytesIO(source) if isinstance(source, bytes) else source, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise refusal(where, exc) from None


def refusal(where: object, exc: BaseException) -> UnsafeCheckpointError:
    """One line for a file a weights-only load refused (torch's message is a paragraph)."""
    found = _REASON.search(str(exc))
    reason = found.group(1).rstrip(".") if found else "not plain tensors and containers"
    return UnsafeCheckpointError(
        f"{where}: refused to load: it holds more than tensors, numbers and containers ({reason}), which "
        "could run code; Primus never writes such a file: check who can write this storage, and remove it"
    )
