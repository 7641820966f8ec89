"""docs/spec.md's field reference, generated from the spec models (the CRD's source too), so every
field a user can set is documented with its type, default and meaning.

    python -m primus_lib.spec.reference docs/spec.md   # rewrites the block between the markers
"""

from __future__ import annotations

import sys
import types
import typing
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from primus_lib.markdown import replace_block
from primus_lib.spec.job import JobSpec

BEGIN, END = "<!-- reference:begin (python -m primus_lib.spec.reference docs/spec.md) -->", "<!-- reference:end -->"


def _models(annotation) -> list[type[BaseModel]]:
    """The spec models inside a field's type (lists, dicts, optionals included)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _type(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        text = " or ".join(_type(a) for a in parts)
        return f"{text} (optional)" if len(parts) < len(typing.get_args(annotation)) else text
    if origin in (list, tuple):
        return f"list of {_type(typing.get_args(annotation)[0])}"
    if origin is dict:
        return f"map to {_type(typing.get_args(annotation)[1])}"
    name = getattr(annotation, "__name__", str(annotation))
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "timedelta": "duration"}.get(
        name, name
    )


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        unit = next((f"{seconds // n}{u}" for n, u in ((86400, "d"), (3600, "h"), (60, "m")) if seconds % n == 0), None)
        return f"`{unit or f'{seconds}s'}`" if seconds else "`0s`"
    return "" if value is None else f"`{value}`"


def rows(model: type[BaseModel] = JobSpec, prefix: str = "spec") -> list[tuple[str, str, str, str]]:
    """``(path, type, default, description)`` of every field, depth first."""
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        description = " ".join((field.description or "").split())
        out.append((path, _type(field.annotation), _default(field), description))
        for sub in _models(field.annotation):
            suffix = "[]" if typing.get_origin(field.annotation) in (list, tuple) else ""
            suffix = ".*" if typing.get_origin(field.annotation) is dict else suffix
            out += rows(sub, path + suffix)
    return out


def table() -> str:
    lines = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for path, kind, default, description in rows():
        escaped = description.replace("|", "\\|")
        lines.append(f"| `{path}` | {kind} | {default} | {escaped} |")
    return "\n".join(lines)


def rewrite(document: str) -> str:
    return replace_block(document, BEGIN, END, table())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m primus_lib.spec.reference docs/spec.md", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        path.write_text(rewrite(path.read_text()))
    except (OSError, ValueError) as exc:
        print(f"spec reference: {path}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
