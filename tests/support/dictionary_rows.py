"""Typed rows whose string leaves repeat (or not), for the dictionary-encoding tests and the format-2
fixture tests/fixtures/make_format2_v1.py wrote."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_state.format import tables
from spark_state.keygroups import key_groups_of

M = 64
#: Nested string and binary leaves, nullable at every level, beside fields that are never encoded.
KEY = pa.struct([("user", pa.string()), ("n", pa.int64())])
VALUE = pa.struct([("country", pa.string()), ("blob", pa.binary()),
                   ("inner", pa.struct([("page", pa.string()), ("clicks", pa.int64()),
                                        ("deep", pa.struct([("tag", pa.large_string())]))])),
                   ("note", pa.string())])
SCHEMA = tables.typed_schema(KEY, VALUE)


def make_table(rows: int, distinct: int, seed: int, *, null_share: float = 0.1, deletes: bool = False) -> pa.Table:
    """`rows` rows whose string leaves take `distinct` values (or are all distinct when distinct >= rows)."""
    rng = np.random.default_rng(seed)
    pool = ["", "ü/ß", "/product/1042"] + [f"w{i:05d}" for i in range(max(0, distinct - 3))]
    pool = pool[:max(1, distinct)]

    def s(i):
        if rng.random() < null_share:
            return None
        return pool[int(rng.integers(len(pool)))] if distinct < rows else f"id-{i}-{rng.integers(1 << 30)}"

    keys = [{"user": f"user-{i:06d}", "n": i} for i in range(rows)]
    values = []
    for i in range(rows):
        if deletes and rng.random() < 0.1:
            values.append(None)
            continue
        inner = None if rng.random() < null_share else {
            "page": s(i), "clicks": i, "deep": None if rng.random() < null_share else {"tag": s(i)}}
        blob = s(i)
        values.append({"country": s(i), "blob": None if blob is None else blob.encode(), "inner": inner,
                       "note": f"unique {i}"})
    hashes = rng.integers(-(2**31), 2**31, rows).astype(np.int32)
    return pa.table({"kg": pa.array(key_groups_of(hashes, M), pa.int32()), "hash": pa.array(hashes),
                     "key": pa.array(keys, KEY), "value": pa.array(values, VALUE)}, schema=SCHEMA)


def fixture_table() -> pa.Table:
    """The rows of tests/fixtures/format2/v1-plain-index.arrow (written by tests/fixtures/make_format2_v1.py)."""
    return sorted_by_kg(make_table(700, 6, 11, deletes=True))


def sorted_by_kg(t: pa.Table) -> pa.Table:
    return t.take(np.argsort(t.column("kg").to_numpy(), kind="stable"))
