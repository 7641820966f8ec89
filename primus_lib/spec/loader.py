"""Load PrimusJob specs from YAML, expanding ``${VAR}`` and ``${VAR:-default}``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from primus_lib.settings import spec_environment
from primus_lib.spec.checks import check_job
from primus_lib.spec.errors import Problem, SpecError, field_path, problems_from_validation
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.safety import has_control

MAX_VALUES = 100_000  # mappings, lists and scalars in a spec after alias expansion
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~25x faster, every DAG parse loads a spec
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_job(
    path: str | Path, env: Mapping[str, str] | None = None, *, warnings: list[Problem] | None = None
) -> PrimusJob:
    """Read and validate one spec file; raise :class:`SpecError` listing every problem.

    An unset ``${VAR}`` is an error, unless ``warnings`` is given: then it is expanded to the
    empty string (as docker compose does) and reported there, so a spec can be checked on a
    machine that lacks the job's runtime environment.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(source, [Problem("(file)", "a readable YAML file", exc.strerror or str(exc))]) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            source, [Problem("(file)", "a UTF-8 text file", f"byte {exc.object[exc.start]:#04x} at offset {exc.start}")]
        ) from None
    return parse_job(text, source, env, warnings=warnings)


def parse_job(
    text: str,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    *,
    warnings: list[Problem] | None = None,
) -> PrimusJob:
    try:
        document = yaml.load(text, Loader=_YAML_LOADER)  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, [Problem(where, "valid YAML", problem)]) from None
    if not isinstance(document, dict):
        raise SpecError(
            source, [Problem("(document)", "a mapping with apiVersion, kind, metadata, spec", type(document).__name__)]
        )
    return job_from_document(document, source, env, warnings=warnings)


def job_from_document(
    document: dict[str, Any],
    source: str = "<object>",
    env: Mapping[str, str] | None = None,
    *,
    warnings: list[Problem] | None = None,
) -> PrimusJob:
    unset: list[Problem] = []
    budget = [MAX_VALUES]
    try:
        expanded = _expand(document, (), spec_environment() if env is None else env, unset, budget)
    except _TooLarge:
        raise SpecError(
            source, [Problem("(document)", f"at most {MAX_VALUES} values (YAML aliases are expanded)", "more")]
        ) from None
    hostile = [p for p in unset if p.found != "it unset"]
    if hostile:  # a variable's value that no spec field may hold: an error even when warnings are asked
        raise SpecError(source, hostile)
    if unset and warnings is None:
        raise SpecError(source, unset)
    if warnings is not None:
        warnings.extend(unset)
    try:
        job = PrimusJob.model_validate(expanded)
    except ValidationError as exc:
        raise SpecError(source, problems_from_validation(exc)) from None
    problems = check_job(job)
    if problems:
        raise SpecError(source, problems)
    return job


class _TooLarge(Exception):
    pass


def _expand(value: Any, loc: tuple, env: Mapping[str, str], problems: list[Problem], budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:  # YAML aliases share nodes; expanding them copies (a "billion laughs")
        raise _TooLarge
    if isinstance(value, dict):
        return {k: _expand(v, (*loc, k), env, problems, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*loc, i), env, problems, budget) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            if has_control(env[name]):  # a newline etc. would split a path, a log line, a header
                at = next(i for i, c in enumerate(env[name]) if has_control(c))
                problems.append(  # never the value itself: it may be a password
                    Problem(
                        field_path(loc),
                        f"environment variable {name} without control characters",
                        f"{env[name][at]!r} at character {at} of its value",
                    )
                )
            return env[name]
        if default is not None:
            return default
        problems.append(
            Problem(field_path(loc), f"environment variable {name} to be set (or ${{{name}:-default}})", "it unset")
        )
        return ""

    return _ENV.sub(substitute, value)
