"""Which rows of typed state share a key: the worker's merge of a chain needs key equality.

Opaque rows compare keys as ``UnsafeRow`` bytes; typed rows (file format 2)
hold the key as a struct column, which Arrow cannot hash as one value. Two
typed keys are equal exactly when their UnsafeRows are (Spark writes one
canonical row per value), i.e. when every leaf field is equal, nulls equal
to nulls. ``key_codes`` numbers the keys so that equal keys get equal codes:
each leaf is dictionary-encoded (nulls as a value) and the codes combined
column by column. Leaves Arrow cannot dictionary-encode (lists, maps) are
compared by their Python values; keys of that kind are rare (a grouping by
an array column) and only deltas and the base rows they touch get here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


#: Arrow's INTERVAL_MONTHS type id (Spark's year-month interval): pyarrow has no Python array class for it,
#: so a struct holding one cannot be taken apart; its layout is an int32 per row.
_MONTH_INTERVAL = 21


def _viewable(t: pa.DataType) -> pa.DataType:
    """``t`` with every month interval relabelled int32 (same bytes), so the leaves can be walked."""
    if t.id == _MONTH_INTERVAL:
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_viewable(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_viewable(t.key_type), _viewable(t.item_type))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_viewable(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_viewable(t.value_type)))
    return t


def _leaves(array: pa.Array):
    """Leaf arrays of a (nested) struct array, with each struct level's validity as a leaf of its own."""
    if pa.types.is_struct(array.type):
        if array.null_count:
            yield array.is_valid()
        for child in array.flatten():   # flatten applies the parent's validity to its children
            yield from _leaves(child)
    else:
        yield array


def _dictionary_codes(leaf: pa.Array) -> tuple[np.ndarray, int]:
    try:
        encoded = pc.dictionary_encode(leaf, null_encoding="encode")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        encoded = pc.dictionary_encode(pa.array([repr(v) for v in leaf.to_pylist()], pa.string()))
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), max(len(encoded.dictionary), 1)


def _leaf_codes(leaf: pa.Array) -> tuple[np.ndarray, int]:
    """Codes of a leaf (equal values, equal codes; nulls one value of their own) and their bound (codes < bound).

    Integers without nulls spanning less than 2^40 are their own codes (offset by the minimum): no hash
    table is built for the common key of one long or int column."""
    if pa.types.is_integer(leaf.type) and leaf.null_count == 0 and len(leaf):
        values = leaf.to_numpy(zero_copy_only=False).astype(np.int64)   # uint64 wraps: still one-to-one
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < _WIDE:
            return values - lo, hi - lo + 1
    return _dictionary_codes(leaf)


_WIDE = 1 << 40
_LIMIT = 1 << 62


def key_codes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 per row; equal keys (every leaf equal, nulls included) get equal codes."""
    return _bounded_codes(keys)[0]


def _bounded_codes(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """key_codes and their bound (every code is in [0, bound))."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    viewable = _viewable(keys.type)
    if viewable != keys.type:
        keys = keys.view(viewable)
    codes = np.zeros(len(keys), dtype=np.int64)
    bound = 1
    for leaf in _leaves(keys):
        leaf_codes, width = _leaf_codes(leaf)
        if bound * width >= _LIMIT:   # renumber densely so the combination cannot overflow
            codes = np.unique(codes, return_inverse=True)[1].astype(np.int64)
            bound = int(codes.max(initial=0)) + 1
            if bound * width >= _LIMIT:
                leaf_codes, width = _dictionary_codes(leaf)
        codes = codes * width + leaf_codes
        bound *= width
    return codes, bound


#: Codes spanning at most this many slots per row index a table directly; sparser ones are renumbered first.
_DENSE_SLOTS_PER_ROW = 4


def last_write_mask(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A bool per row (rows in write order): True where the row is its key's last write.

    Each code's newest row is found by direct addressing (``np.maximum.at`` of
    row positions into a slot per code): measured 6.8 ms on 1.9M rows against
    137 ms for Arrow's hash group-by and 106 ms for a stable argsort. Codes
    spread wider than a few slots per row (random longs, multi-field keys) are
    renumbered by one hash pass (dictionary encoding) first.
    """
    n = len(keys)
    if n <= 1:
        return np.ones(n, dtype=bool)
    codes, bound = _bounded_codes(keys)
    if bound > _DENSE_SLOTS_PER_ROW * n:
        encoded = pc.dictionary_encode(pa.array(codes))
        codes, bound = encoded.indices.to_numpy(zero_copy_only=False), len(encoded.dictionary)
    position_type = np.int32 if n < 2**31 else np.int64
    last = np.full(bound, -1, dtype=position_type)
    np.maximum.at(last, codes, np.arange(n, dtype=position_type))
    keep = np.zeros(n, dtype=bool)
    keep[last[last >= 0]] = True
    return keep


def last_per_key(table: pa.Table) -> pa.Table:
    """The last row of each key (rows in write order), in the order those rows had."""
    if table.num_rows <= 1:
        return table
    keep = last_write_mask(table.column("key"))
    return table if keep.all() else table.filter(pa.array(keep))
