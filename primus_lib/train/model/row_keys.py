"""Sample ids as 64-bit keys, hashed from the Arrow column a minibatch at a time.

The trainer matches a batch row to its stream copy by the sample id (``streamed.py``). Hashing
the ids in numpy on the prefetch thread leaves the training thread integer keys to look up
(``key_table.py``) instead of a Python string per row. The keys must be stable across processes,
versions and machines (they are checkpointed and compared across data-parallel ranks). Integer
ids: SplitMix64 of the value, as the sparse features' ``hash_buckets`` before its modulo.
Strings: the UTF-8 bytes as little-endian 64-bit words straight from the Arrow buffers, each
folded in with SplitMix64, then the length. ``hash_buckets``' string hash (pandas' SipHash)
needs a Python string per row first, the cost this module exists to avoid: 7x slower at 8,192
ids, where every id is distinct and its dictionary encoding saves nothing. Two distinct ids share
a key with probability about 2^-64 per pair; such a pair would be taken for one row (its batch
copy trained on the other's stream label). A row without an id gets ``NO_KEY``, never recorded
nor found.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from primus_lib.data.schema import splitmix64

NO_KEY = np.uint64(0)
# the ids' keys as a column of the rows the trainer reads (``with_keys``): hashing costs per call
# (~50 numpy calls), so a block of thousands of rows costs about what one minibatch did
KEY_COLUMN = "__row_key"
_SEED = np.uint64(0xD1B54A32D192ED03)  # a string's key starts here
_LENGTH = np.uint64(0xBF58476D1CE4E5B9)  # its length, times this, is folded in last


def row_keys(column: pa.Array | pa.ChunkedArray | Sequence[str]) -> np.ndarray:
    """The uint64 key of every row's id (strings, binary or integers; ``NO_KEY`` where null)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    elif not isinstance(column, pa.Array):
        column = pa.array(list(column), pa.string())
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_string_view(column.type) or pa.types.is_binary_view(column.type):
        column = column.cast(pa.large_binary())  # views point into many buffers: one offsets layout
    kind = column.type
    if pa.types.is_integer(kind):
        keys = splitmix64(column.fill_null(0).to_numpy().astype(np.int64).view(np.uint64))
    elif pa.types.is_string(kind) or pa.types.is_binary(kind):
        keys = _bytes_keys(column, np.int32)
    elif pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        keys = _bytes_keys(column, np.int64)
    else:
        raise TypeError(f"sample ids of type {kind}: expected strings, binary or integers (spec.features.id)")
    keys[keys == NO_KEY] = 1  # a real id that hashes to NO_KEY (p = 2^-64) stays findable
    if column.null_count:
        keys[column.is_null().to_numpy(zero_copy_only=False)] = NO_KEY
    return keys


def with_keys(table: pa.Table, id_column: str | None, rehash: bool = False) -> pa.Table:
    """``table`` with the keys of its ids (``id_column``) in ``KEY_COLUMN``; without that column when it
    has no ids or none are asked for. ``rehash``: recompute keys it already has (rows a checkpoint kept,
    perhaps under another spec), so that every table of a buffer has the same columns."""
    names = table.schema.names
    if KEY_COLUMN in names and (rehash or id_column is None or id_column not in names):
        table, names = table.drop_columns([KEY_COLUMN]), [n for n in names if n != KEY_COLUMN]
    if id_column is None or id_column not in names or KEY_COLUMN in names or not table.num_rows:
        return table
    return table.append_column(KEY_COLUMN, pa.array(row_keys(table.column(id_column)), pa.uint64()))


def _bytes_keys(column: pa.Array, offset_type: type) -> np.ndarray:
    n = len(column)
    _, offsets_buffer, data_buffer = column.buffers()
    if offsets_buffer is None:  # an all-null array of length 0
        return np.zeros(n, np.uint64)
    offsets = np.frombuffer(offsets_buffer, offset_type)[column.offset : column.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    longest = int(lengths.max()) if n else 0
    width = -(-longest // 8) * 8
    padded = np.zeros((n, width), np.uint8)
    start, end = int(offsets[0]), int(offsets[-1]) if n else 0
    if n and int(lengths.min()) == longest:  # every id as long (hex ids, UUIDs): one reshape
        padded[:, :longest] = data[start:end].reshape(n, longest)
    elif end > start:  # each byte to its row and column
        rows = np.repeat(np.arange(n), lengths)
        columns = np.arange(end - start) - np.repeat(offsets[:-1] - start, lengths)
        padded.ravel()[rows * width + columns] = data[start:end]
    words = padded.view("<u8")
    counts = -(-lengths // 8)  # each id's own words: the hash does not depend on its neighbours
    keys = np.full(n, _SEED, np.uint64)
    for j in range(width // 8):
        if int(counts.min()) > j:
            keys = splitmix64(keys ^ words[:, j])
        else:
            has = counts > j
            keys[has] = splitmix64(keys[has] ^ words[has, j])
    return splitmix64(keys ^ (lengths.astype(np.uint64) * _LENGTH))
