"""Spec problems as one readable line each: file, field path, what was expected, what was found."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails


@dataclass(frozen=True)
class Problem:
    path: str
    expected: str
    found: str

    def format(self, source: str) -> str:
        return f"{source}: {self.path}: expected {self.expected}, found {self.found}"


class SpecError(Exception):
    """A spec that cannot be used; carries every problem found, not just the first."""

    def __init__(self, source: str, problems: Sequence[Problem]):
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(p.format(source) for p in self.problems))


def field_path(loc: Sequence[str | int]) -> str:
    """``("spec", "dataset", "streams", 1, "name")`` -> ``spec.dataset.streams[1].name``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(document)"


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    if isinstance(value, list):
        return f"a list of {len(value)}" if value else "an empty list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected(error: ErrorDetails) -> str:
    kind = error["type"]
    msg: str = error["msg"]
    ctx = error.get("ctx") or {}
    if kind == "timezone_aware":
        return "an instant with a time zone, e.g. 2026-11-01T00:00:00Z"
    if kind == "missing":
        return "a value (required field)"
    if kind == "extra_forbidden":
        return "no such field (unknown field; check its spelling)"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        return expected if "," not in expected and " or " not in expected else "one of " + expected
    if kind == "string_pattern_mismatch":
        return f"a string matching {ctx.get('pattern')}"
    if kind in {"too_short", "too_long"}:
        return msg.replace("List should have", "a list with").replace("Value should have", "a value with")
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    if msg.startswith("Input should be "):
        return msg[len("Input should be ") :]
    if msg.startswith("Input should have "):
        return "a value with " + msg[len("Input should have ") :]
    return msg[0].lower() + msg[1:]


def problems_from_validation(error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = [part for part in item["loc"] if not _is_union_tag(part)]
        found = "nothing" if item["type"] == "missing" else describe(item.get("input"))
        problems.append(Problem(field_path(loc), _expected(item), found))
    return problems


def _is_union_tag(part: str | int) -> bool:
    # pydantic adds the member type's name to the location of union errors
    return isinstance(part, str) and (
        part.startswith(("function-", "lax-", "json-"))
        or part in {"str", "int", "float", "bool", "datetime", "timedelta"}
    )
