"""Path templates with time placeholders: which partition a window reads.

A template is a source URI such as ``s3://logs/impressions/{YYYY}{MM}{DD}/{HH}/``. A URI that
ends in ``/`` names a partition directory whose files match ``file_pattern``; otherwise the
last path component is itself a glob for the partition's files (``.../{HH}/part-*.parquet``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime

_FIELDS = {"YYYY": "%Y", "MM": "%m", "DD": "%d", "HH": "%H"}
_PLACEHOLDER = re.compile(r"\{(YYYY|MM|DD|HH)\}")


def render(template: str, when: datetime) -> str:
    """The template with every placeholder replaced by ``when``'s UTC fields."""
    return _PLACEHOLDER.sub(lambda m: when.strftime(_FIELDS[m.group(1)]), template)


def has_placeholders(template: str) -> bool:
    return _PLACEHOLDER.search(template) is not None


@dataclass(frozen=True)
class Partition:
    """Where one source keeps the data of one window: a directory and a file-name glob."""

    directory: str  # a path inside the filesystem, ends with "/"
    pattern: str
    marker: str | None

    def matches(self, name: str) -> bool:
        if self.marker is not None and name == self.marker:
            return False
        if name.startswith((".", "_")):  # hidden and bookkeeping files (_SUCCESS, .crc, _temporary)
            return False
        return self.pattern == "*" or fnmatch.fnmatchcase(name, self.pattern)

    @property
    def marker_path(self) -> str | None:
        return None if self.marker is None else self.directory + self.marker


def partition(path_template: str, when: datetime, file_pattern: str, marker: str | None) -> Partition:
    """The partition of ``when`` for a template already stripped of its scheme."""
    rendered = render(path_template, when)
    if rendered.endswith("/"):
        return Partition(rendered, file_pattern, marker)
    directory, _, pattern = rendered.rpartition("/")
    return Partition(directory + "/", pattern, marker)
