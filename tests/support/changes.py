"""Changes tables as the shim sends them (kg, hash, key, value; a null value deletes the key), built
one way for every test, and the dicts tests compare them with.

``kg`` is computed here from its definition, Java's ``pmod(hash, maxParallelism)``, not by
spark_state.keygroups (tests/unit/test_keygroups.py checks that one against the same definition).
Each test chooses how keys hash: ``len`` (the default) puts keys of one length in one key group;
``HASHES`` makes keys collide on purpose and reach the int32 extremes.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from spark_state.format.tables import CHANGES_SCHEMA, typed_schema
from spark_state.options import DEFAULT_MAX_PARALLELISM

#: The key-group count of the store tests: small, so a few keys cover every key group and collide.
M = 16

#: Keys with hand-picked hashes: k5/k6 and the last two share a hash (collisions must not merge different
#: keys), the int32 extremes and negative hashes appear, and with max parallelism 16 they spread over
#: several key groups. The empty key is a key too.
KEYS = [b"k%d" % i for i in range(10)] + [b"", b"\x00\xff"]
HASHES = {k: h for k, h in zip(KEYS, [5, -5, 21, 2**31 - 1, -(2**31), 7, 7, 0, 16, -16, 3, 3])}


def key_groups(hashes: Iterable[int], max_parallelism: int) -> pa.Array:
    """pmod(hash, max_parallelism) per hash, as Spark's shim computes it."""
    return pa.array(np.mod(np.asarray(list(hashes), dtype=np.int64), max_parallelism).astype(np.int32))


def changes_table(hashes: Iterable[int], keys: list, values: list, *,
                  max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> pa.Table:
    """Opaque changes with the given hash, key and value of each row, in this order (keys may repeat)."""
    hashes = np.asarray(list(hashes), dtype=np.int32)
    return pa.table({"kg": key_groups(hashes, max_parallelism), "hash": pa.array(hashes),
                     "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())},
                    schema=CHANGES_SCHEMA)


def opaque_changes(pending: Mapping[bytes, bytes | None], *, hash_of: Callable[[bytes], int] = len,
                   max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> pa.Table:
    """Opaque changes of ``pending`` (key -> value, None = delete), in its order, hashed by ``hash_of``."""
    keys = list(pending)
    return changes_table([hash_of(k) for k in keys], keys, [pending[k] for k in keys],
                         max_parallelism=max_parallelism)


def typed_changes(rows: Iterable[tuple[object, object | None]], key_type: pa.DataType, value_type: pa.DataType, *,
                  hash_of: Callable[[object], int], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> pa.Table:
    """Typed changes: (key, value) pairs of Python values of the two struct types (value None = delete)."""
    rows = list(rows)
    hashes = np.array([hash_of(k) for k, _ in rows], dtype=np.int32)
    return pa.table({"kg": key_groups(hashes, max_parallelism), "hash": pa.array(hashes),
                     "key": pa.array([k for k, _ in rows], key_type),
                     "value": pa.array([v for _, v in rows], value_type)},
                    schema=typed_schema(key_type, value_type))


def as_dict(table: pa.Table) -> dict:
    """key -> value of a loaded state (opaque keys), checking that no key appears twice."""
    keys = table.column("key").to_pylist()
    assert len(set(keys)) == len(keys), f"a key twice in one table: {keys}"
    return dict(zip(keys, table.column("value").to_pylist()))


def changes(pending: Mapping[bytes, bytes | None]) -> pa.Table:
    """Opaque changes of keys from KEYS, hashed by HASHES, for max parallelism M."""
    return opaque_changes(pending, hash_of=HASHES.__getitem__, max_parallelism=M)


def checked_dict(table: pa.Table, *, hash_of: Callable[[bytes], int] = HASHES.__getitem__,
                 max_parallelism: int = M) -> dict:
    """as_dict of a loaded opaque state, checking it is one a reader may return: exactly CHANGES_SCHEMA, no
    deletes left, sorted by key group, and every row's hash and key group those of its key."""
    assert table.schema == CHANGES_SCHEMA
    assert table.column("value").null_count == 0
    kgs = table.column("kg").to_numpy()
    assert (np.diff(kgs) >= 0).all()
    out = as_dict(table)
    for k, kg, h in zip(out, kgs, table.column("hash").to_pylist()):
        assert h == hash_of(k) and kg == h % max_parallelism
    return out
