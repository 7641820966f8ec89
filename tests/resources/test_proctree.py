from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from primus_lib.resources import proctree


@pytest.mark.parametrize("has_proc", [True, False], ids=["proc", "psutil-fallback"])
def test_descendants_and_rss_match_psutil_for_a_grandchild(has_proc, monkeypatch):
    """A child that starts its own child: both are found, neither the caller; RSS agrees with psutil
    (read from /proc, and through the fallback of hosts without it)."""
    monkeypatch.setattr(proctree, "HAS_PROC", has_proc)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(30)']); print(p.pid, flush=True); time = __import__('time'); "
            "time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        grandchild = int(child.stdout.readline())
        found = proctree.descendants(os.getpid())
        assert child.pid in found and grandchild in found and os.getpid() not in found
        assert proctree.tree(os.getpid())[0] == os.getpid()
        # the child's own subtree is fixed; the test process's may change under us (servers that
        # fixtures started fork helpers), so the exact comparison with psutil is made there
        assert proctree.descendants(child.pid) == [grandchild]
        assert proctree.tree(child.pid) == [child.pid, grandchild]
        assert [p.pid for p in psutil.Process(child.pid).children(recursive=True)] == [grandchild]
        expected = psutil.Process(child.pid).memory_info().rss
        assert abs(proctree.rss(child.pid) - expected) <= 1 << 20
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()


@pytest.mark.parametrize("has_proc", [True, False], ids=["proc", "psutil-fallback"])
def test_rss_of_a_gone_process_is_zero(has_proc, monkeypatch):
    monkeypatch.setattr(proctree, "HAS_PROC", has_proc)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert proctree.descendants(int(done.stdout)) == []
    assert proctree.rss(int(done.stdout)) == 0
