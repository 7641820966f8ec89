"""Files readable by their owner only: the dev stack's logins, keys and tokens."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, mode 0600 from the start (an older file of another mode too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
