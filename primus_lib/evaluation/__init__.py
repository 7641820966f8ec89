"""``primus eval``: the trainer backtested over replayed worlds (``backtest.py``, ``timeline.py``), its
sources and report, the real logs shipped in wheels, and the results table across worlds."""
