"""mypy over the packages, started when the suite's collection ends so its minute or two of CPU
overlaps the tests that wait on servers (the suite's slowest lint on a fresh clone, with no cache);
``tests/test_lint.py`` waits for its verdict. Run alone, that test starts it itself."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
MYPY = Path(sys.executable).parent / "mypy"
TEST = "tests/test_lint.py::test_mypy_is_clean_on_the_packages"


@dataclass
class TypeCheck:
    proc: subprocess.Popen[bytes]
    output: IO[bytes]  # stdout and stderr together: a file, so a long report never blocks mypy

    def result(self, timeout: float = 600) -> tuple[int, str]:
        """mypy's exit status and report, once it has finished."""
        try:
            returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.output.seek(0)
        return returncode, self.output.read().decode(errors="replace")


_started: TypeCheck | None = None


def start() -> TypeCheck:
    """Start mypy (pyproject's [tool.mypy]) unless it already runs; once per session."""
    global _started
    if _started is None:
        output = tempfile.TemporaryFile()
        proc = subprocess.Popen([str(MYPY)], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        _started = TypeCheck(proc, output)
    return _started


def stop() -> None:
    """At the session's end: a mypy whose test did not run (deselected, interrupted) is killed."""
    if _started is not None and _started.proc.poll() is None:
        _started.proc.kill()
        _started.proc.wait()
