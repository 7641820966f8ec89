"""Backtests of the training modes: ``primus eval`` and the results table across worlds."""
