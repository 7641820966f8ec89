"""Progress of long ``primus`` commands on stderr, for a person watching or a log read later.

On a terminal it is a tqdm bar redrawn in place; when stderr is not a terminal (CI, a log file,
``2>file``) every step is one plain line instead, so logs stay readable and greppable; with
``--quiet`` there is none. Results stay on stdout: progress never mixes into what a script parses.
"""

from __future__ import annotations

import sys
import time
from typing import Self, TextIO


class Progress:
    """``total`` steps named ``unit``; ``advance`` one per window/hour/run as it finishes.

    ``tty`` forces the mode (default: whether ``stream`` is a terminal).
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        unit: str,
        *,
        quiet: bool = False,
        stream: TextIO | None = None,
        tty: bool | None = None,
    ) -> None:
        self.label, self.total, self.unit, self.quiet = label, total, unit, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.began = time.monotonic()
        self._bar = None
        if not quiet and (tty if tty is not None else _isatty(self.stream)):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=f" {unit}", file=self.stream, dynamic_ncols=True)

    def set_total(self, total: int) -> None:
        """The total once it is known (e.g. after the data is loaded)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def advance(self, item: str, n: int = 1, *, keep: bool = False) -> None:
        """``n`` more steps done, the last one described by ``item``; ``keep``: on a terminal, also
        leave the line above the bar (what the plain mode prints for every step)."""
        self.done += n
        if self.quiet:
            return
        line = f"{self.label} [{self.done}/{self.total if self.total is not None else '?'}] {item}"
        if self._bar is None:
            print(line, file=self.stream, flush=True)
            return
        if keep:
            self._bar.write(line, file=self.stream)
        self._bar.set_postfix_str(item, refresh=False)
        self._bar.update(n)

    def skip(self, n: int = 1) -> None:
        """``n`` steps done that deserve no line of their own (the bar still moves)."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def status(self, text: str) -> None:
        """What is going on between steps (loading, generating): the bar's label on a terminal; no
        line otherwise (stderr stays what it was, e.g. one line for a bad input)."""
        if self._bar is not None:
            self._bar.set_description_str(f"{self.label}: {text}")

    def note(self, line: str, *, file: TextIO | None = None) -> None:
        """One line that is not a step (a phase, a result): above the bar on a terminal; ``file``
        (default stderr) takes it; ``quiet`` drops it unless it goes elsewhere than stderr."""
        target = file if file is not None else self.stream
        if self.quiet and target is self.stream:
            return
        if self._bar is not None:
            self._bar.write(line, file=target)
        else:
            print(line, file=target, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


def seconds(value: float | None) -> str:
    """A duration for people: 4.2s, 3m05s, 1h02m."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(round(value)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"
