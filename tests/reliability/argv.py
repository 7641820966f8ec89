"""Every process's command line, sampled on a thread while a run goes on: what ``ps`` shows to any
user of the host. ``leaks`` says which known secret appeared in which command line."""

from __future__ import annotations

import threading

import psutil


class ArgvSampler:
    """``with ArgvSampler() as argv:`` samples every ``every`` seconds (once more on exit)."""

    def __init__(self, every: float = 0.2) -> None:
        self.every = every
        self.seen: set[tuple[str, ...]] = set()  # distinct command lines
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="argv-sampler", daemon=True)

    def __enter__(self) -> ArgvSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info.get("cmdline")  # None: gone or not ours to read
            if cmdline:
                self.seen.add(tuple(cmdline))
        self.samples += 1

    def saw(self, *fragments: str) -> bool:
        """Whether some command line held every fragment (in any of its arguments)."""
        return any(all(f in " ".join(cmd) for f in fragments) for cmd in self.seen)

    def leaks(self, secrets: dict[str, str]) -> list[str]:
        """``<what> in argv: <command line, the secret masked>`` for each secret found."""
        found = []
        for cmd in sorted(self.seen):
            line = " ".join(cmd)
            for what, value in secrets.items():
                if value and value in line:
                    found.append(f"{what} in argv: {line.replace(value, '***')[:300]}")
        return found
