"""`ExecutorMetrics.observe_process`: the RSS of the whole process tree, not the process alone."""

from __future__ import annotations

import subprocess
import sys

import psutil
from prometheus_client import CollectorRegistry

from primus_lib.metrics import ExecutorMetrics

HOLD = 64 << 20  # bytes the grandchild touches, so that it cannot vanish in the noise


def test_observe_process_counts_the_memory_of_every_descendant():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            f"'import time; b = bytearray({HOLD}); print(1, flush=True); time.sleep(30)'], "
            "stdout=subprocess.PIPE, text=True); p.stdout.readline(); print(p.pid, flush=True); "
            "time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        grandchild = int(child.stdout.readline())
        metrics = ExecutorMetrics(
            "job", "0", cpu_limit=1, memory_limit=1 << 30, registry=CollectorRegistry(), pid=child.pid
        )
        metrics.observe_process()
        both = psutil.Process(child.pid).memory_info().rss + psutil.Process(grandchild).memory_info().rss
        assert metrics.rss._value.get() >= psutil.Process(child.pid).memory_info().rss + HOLD * 0.9
        assert abs(metrics.rss._value.get() - both) <= 2 << 20
        assert metrics.memory._value.get() == metrics.rss._value.get() / (1 << 30)
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()
