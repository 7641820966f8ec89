"""The Airflow plugin: registers the Timer timetable and the pool listener.

Loaded through the ``airflow.plugins`` entry point (``primus_operators.plugin:PrimusPlugin``)
or from ``plugins/`` as ``[core] plugins_folder``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from primus_operators import listeners
from primus_operators.timetables.window import PrimusWindowTimetable


class PrimusPlugin(AirflowPlugin):
    name = "primus"
    timetables = [PrimusWindowTimetable]
    listeners = [listeners]
