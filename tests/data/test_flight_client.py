"""The trainer's reader of the stream executors, where no executor is found: it says so once."""

from __future__ import annotations

import logging
import time

from primus_lib.data import flight_client
from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.resources.discovery import LocalDiscovery


def test_a_reader_without_executors_says_where_it_looked_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(flight_client, "NO_EXECUTOR_WARNING", 0.2)
    registry = tmp_path / "resources" / "executors" / "realtime"
    reader = ExecutorStreamReader(LocalDiscovery(registry), retry=0.05)
    with caplog.at_level(logging.WARNING, logger=flight_client.__name__):
        reader._ensure_started()
        time.sleep(1.0)  # five times the bound: still one line
        reader.close()
    said = [r.getMessage() for r in caplog.records if "no stream executor found" in r.getMessage()]
    assert said == [
        f"no stream executor found in the registry {registry} for 0.2 s: waiting (start them with "
        "`primus executor SPEC` or through the job's resource backend)"
    ]
