"""Primus: unified training for large deep learning recommendation models.

The engine: importable and testable without Airflow.
"""

from __future__ import annotations

__version__ = "0.1.0"
