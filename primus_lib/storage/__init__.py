"""The store: every place job state lives is a ``StorageLocation``, and callers never ask which.

``spec.storage.root`` may be a local path (``file://``), ``s3://bucket/prefix`` or
``webhdfs://host:port/path``; ``locate`` maps any of them (or a location's URI, as the training
queue records it) to a location, with the credentials of the spec's ``storage.connection_id``
(``primus_lib.credentials``; ``JobPaths.for_job`` resolves them). The local disk is one backend
among the others behind the same operations (``location.py``): read, list, write a part, put a
file atomically, delete. Windows, checkpoints and sharded models commit by one protocol with one
recovery rule (``commit.py``: parts first, a manifest LAST; a reader trusts only what a committed
manifest names and checks part sizes; uncommitted parts are garbage). A remote store that is away
costs each call a bounded wait, then ``StorageUnavailable`` (``remote.py``).
"""

from __future__ import annotations

from primus_lib.storage.commit import Part, Parts, read_part, sweep, verify
from primus_lib.storage.location import Entry, StorageLocation
from primus_lib.storage.remote import StorageUnavailable
from primus_lib.storage.uri import Where, local_directory, locate, scheme_of, unique_name, unresolved

RETRY_SECONDS = 120.0  # how long a remote call waits out an unreachable store (tests shorten it in-process)
REREAD_SECONDS = 10.0  # how long a read of one HDFS file that another writer keeps replacing tries, before giving up

__all__ = [
    "Entry",
    "Part",
    "Parts",
    "StorageLocation",
    "StorageUnavailable",
    "Where",
    "local_directory",
    "locate",
    "read_part",
    "scheme_of",
    "sweep",
    "unique_name",
    "unresolved",
    "verify",
]
