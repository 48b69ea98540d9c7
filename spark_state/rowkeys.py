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
    return codes


def last_per_key(table: pa.Table) -> pa.Table:
    """The last row of each key (rows in write order), in the order those rows had."""
    if table.num_rows <= 1:
        return table
    codes = key_codes(table.column("key"))
    positions = (pa.table({"code": codes, "position": np.arange(len(codes), dtype=np.int64)})
                 .group_by("code", use_threads=False).aggregate([("position", "max")]))   # a hash, no sort
    last = np.sort(positions.column("position_max").to_numpy())
    return table if len(last) == table.num_rows else table.take(pa.array(last))
