"""Generated blocks of the docs: the text between two markers of a Markdown page, replaced whole
(the settings table, the spec's field reference, the results across worlds)."""

from __future__ import annotations


def replace_block(document: str, begin: str, end: str, body: str) -> str:
    """``document`` with everything between ``begin`` and ``end`` replaced by ``body``."""
    head, found_begin, rest = document.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(f"expected the markers {begin} and {end}")
    return f"{head}{begin}\n{body}\n{end}{tail}"
