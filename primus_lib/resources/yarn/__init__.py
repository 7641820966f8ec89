"""The YARN backend (ResourceManager REST API + our own ApplicationMaster): see backend.py.

Imports are lazy so the AM (``python -m primus_lib.resources.yarn.am``, run in every worker's
container) loads only its own few modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["YarnBackend", "YarnClient"]

if TYPE_CHECKING:
    from primus_lib.resources.yarn.backend import YarnBackend
    from primus_lib.resources.yarn.client import YarnClient


def __getattr__(name: str):
    if name == "YarnBackend":
        from primus_lib.resources.yarn.backend import YarnBackend

        return YarnBackend
    if name == "YarnClient":
        from primus_lib.resources.yarn.client import YarnClient

        return YarnClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
