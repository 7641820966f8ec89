"""Primus on Airflow: timetable, triggers, operators and hooks, laid out like a provider.

Importing this package is cheap on purpose (DAG parsing imports it): submodules import
``primus_lib`` data/train code lazily, inside ``execute``.
"""

from __future__ import annotations
