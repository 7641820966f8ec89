"""Timetables of Primus jobs."""

from __future__ import annotations

from primus_operators.timetables.window import PrimusWindowTimetable

__all__ = ["PrimusWindowTimetable"]
