"""Typed state files (format 2) at their edges: partitions past 2 GiB, renamed fields below lists, interval keys, repeated field names
(a variant column: tests/jvm/test_typed_codec.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_state.chain import VersionedStore
from spark_state.format import tables
from spark_state.keygroups import key_groups_of
from spark_state.options import Settings
from tests.support.changes import M
from tests.support.paths import FIXTURES
from tests.support.stores import store_on



def _store(root, **kw) -> VersionedStore:
    """A store without fsync (these tests write GiBs) and with the default snapshot interval."""
    return store_on(f"file://{root}/s", fsync=False, **{"snapshot_interval": Settings().snapshot_interval, **kw})


# ------------------------------------------------------------------ > 2 GiB of typed values

BIG_KEY = pa.struct([("k", pa.int64())])
BIG_VALUE = pa.struct([("s", pa.string())])
MIB = 1 << 20


def _big_rows(lo: int, hi: int) -> pa.Table:
    """Keys lo..hi-1, each with a 1 MiB string value (built from buffers: no Python string copies)."""
    n = hi - lo
    data = pa.py_buffer(np.full(n * MIB, ord("x"), dtype=np.uint8))
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int64) * MIB).astype(np.int32))
    strings = pa.StringArray.from_buffers(n, offsets, data)
    hashes = np.arange(lo, hi, dtype=np.int32)
    return pa.table({"kg": pa.array(key_groups_of(hashes, M)), "hash": pa.array(hashes),
                     "key": pa.StructArray.from_arrays([pa.array(np.arange(lo, hi))], fields=list(BIG_KEY)),
                     "value": pa.StructArray.from_arrays([strings], fields=list(BIG_VALUE))},
                    schema=tables.typed_schema(BIG_KEY, BIG_VALUE))


@pytest.mark.slow
def test_a_typed_partition_over_2_gib_compacts(tmp_path):
    """Format 1 merges and writes past 32-bit offsets (test_consistency's 'Defect 4'); typed files must too, or
    compaction of a typed chain holding 2.3 GiB of string values fails on every maintenance run."""
    store = _store(tmp_path, snapshot_interval=1, compression_level=1)
    c1 = store.commit(1, _big_rows(0, 1200))
    store.commit(2, _big_rows(1200, 2300), base_commit_id=c1.commit_id)
    store.maintenance(2, version=2)
    assert store.maintenance_failures == 0, store.maintenance_error
    assert store.load(2).num_rows == 2300


@pytest.mark.slow
def test_the_full_upgrade_commit_of_a_typed_partition_over_2_gib_succeeds(tmp_path):
    """The upgrade from a format-1 chain ships a partition's whole state once (commit full=True), as many
    record batches: past 2 GiB of string values the commit must not overflow 32-bit offsets, or it fails on
    every retry and the query cannot get past its first batch."""
    store = _store(tmp_path)
    state = pa.concat_tables([_big_rows(0, 1200), _big_rows(1200, 2300)])   # two record batches, as received
    store.commit(1, state, full=True)
    assert store.load(1).num_rows == 2300


# ------------------------------------------------------------------ export of repeated struct field names

FIXTURE = FIXTURES / "format1" / "agg" / "ckpt-test"


def test_export_keeps_the_values_of_repeated_struct_field_names(tmp_path):
    """Spark names aggregation buffer fields after their function (two sums: sum, sum). export renames them
    apart (sum, sum_2) by position, as read_state does: a cast by name would null sum_2 in the Parquet file."""
    import shutil

    import pyarrow.parquet as pq

    from spark_state.spark.checkpoint import SparkCheckpoint
    from spark_state.lifecycle.export import export

    ckpt_dir = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, ckpt_dir)
    ckpt = SparkCheckpoint(str(ckpt_dir))
    at = ckpt.committed()
    key = pa.struct([("k", pa.string())])
    value = pa.struct([("sum", pa.int64()), ("sum", pa.int64()), ("n", pa.int64())])
    hashes = np.array([7, 9], dtype=np.int32)
    for sid in ckpt.stores(at):   # each store's state at the batch, re-committed as typed files
        store = ckpt.store(sid)
        vals = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([10, 20]), pa.array([3, 4])],
                                          fields=list(value))
        rows = pa.table({"kg": pa.array(key_groups_of(hashes, store.settings.max_parallelism)),
                         "hash": pa.array(hashes), "key": pa.array([{"k": "a"}, {"k": "b"}], key), "value": vals},
                        schema=tables.typed_schema(key, value))
        store.commit(at + 1, rows, full=True)

    out = tmp_path / "out"
    export(str(ckpt_dir), str(out), batch=at)
    part = pq.read_table(out / "operator=0" / "store=default" / "part-00000.parquet")
    assert part.column("value").to_pylist() == [{"sum": 1, "sum_2": 10, "n": 3}, {"sum": 2, "sum_2": 20, "n": 4}]


# ------------------------------------------------------------------ renamed fields nested in a list

def test_a_chain_across_a_renamed_field_inside_an_array_keeps_its_values(tmp_path):
    """Spark's state schema check ignores field names at every depth (equalsIgnoreNameAndCompatibleNullability),
    so a restarted query may name a struct inside an array differently. A chain is aligned to its newest file's
    schema by position at every depth; Arrow's cast matches struct fields by name below lists and maps, and
    would bring the older rows' elements back as all-null structs (and compaction would keep that loss)."""
    key = pa.struct([("k", pa.string())])
    old_value = pa.struct([("n", pa.int64()), ("events", pa.list_(pa.struct([("a", pa.int64()), ("b", pa.string())])))])
    new_value = pa.struct([("n", pa.int64()), ("events", pa.list_(pa.struct([("x", pa.int64()), ("y", pa.string())])))])

    def rows(k: str, h: int, v: dict, value_type) -> pa.Table:
        hashes = np.array([h], dtype=np.int32)
        return pa.table({"kg": pa.array(key_groups_of(hashes, M)), "hash": pa.array(hashes),
                         "key": pa.array([{"k": k}], key), "value": pa.array([v], value_type)},
                        schema=tables.typed_schema(key, value_type))

    store = _store(tmp_path, snapshot_interval=1)
    c1 = store.commit(1, rows("a", 1, {"n": 1, "events": [{"a": 7, "b": "x"}]}, old_value))
    store.commit(2, rows("b", 2, {"n": 2, "events": [{"x": 8, "y": "y"}]}, new_value), base_commit_id=c1.commit_id)
    state = store.load(2)
    by_key = {k["k"]: v for k, v in zip(state.column("key").to_pylist(), state.column("value").to_pylist())}
    assert by_key["a"] == {"n": 1, "events": [{"x": 7, "y": "x"}]}
    store.maintenance(2, version=2)
    assert store.maintenance_failures == 0, store.maintenance_error
    compacted = store.load(2)
    assert {k["k"]: v for k, v in zip(compacted.column("key").to_pylist(), compacted.column("value").to_pylist())}["a"] \
        == {"n": 1, "events": [{"x": 7, "y": "x"}]}


# ------------------------------------------------------------------ a year-month interval in the key

#: What TypedCodec.encode sends for key (id int, k interval year to month), value (v interval year to month,
#: n long), rows (0, 14 months) and (1, null): Spark maps the interval to Arrow's interval[YEAR_MONTH]
#: (pyarrow reads it, but has no Python array class for it).
YEAR_MONTH_CHANGES = (
    "/////xACAAAQAAAAAAAKAA4ABgANAAgACgAAAAAABAAQAAAAAAEKAAwAAAAIAAQACgAAAAgAAAAIAAAAAAAAAAQAAACYAQAA"
    "TAEAALAAAAAEAAAAiv7//xQAAAAUAAAAfAAAAAAADQF4AAAAAAAAAAIAAAA8AAAABAAAALL+//8UAAAAFAAAABQAAAAAAAIB"
    "GAAAAAAAAAAAAAAAoP7//wAAAAFAAAAAAQAAAG4AAADm/v//FAAAABQAAAAUAAAAAAALARAAAAAAAAAAAAAAAEz///8BAAAA"
    "dgAAAFj///8FAAAAdmFsdWUAEgAYABQAAAATAAwAAAAIAAQAEgAAABQAAAAUAAAAgAAAAAAAAA18AAAAAAAAAAIAAAA0AAAA"
    "BAAAAFr///8UAAAAFAAAABQAAAAAAAsBEAAAAAAAAAAAAAAAwP///wEAAABrAAAAhv///xQAAAAUAAAAFAAAAAAAAgEYAAAA"
    "AAAAAAAAAAB0////AAAAASAAAAACAAAAaWQAAAQABAAEAAAAAwAAAGtleQDK////FAAAABQAAAAUAAAAAAACARgAAAAAAAAA"
    "AAAAALj///8AAAABIAAAAAQAAABoYXNoAAASABgAFAATABIADAAAAAgABAASAAAAFAAAABQAAAAcAAAAAAACASAAAAAAAAAA"
    "AAAAAAgADAAIAAcACAAAAAAAAAEgAAAAAgAAAGtnAAD/////uAEAABQAAAAAAAAADAAWAA4AFQAQAAQADAAAAHgAAAAAAAAA"
    "AAAEABAAAAAAAwoAGAAMAAgABAAKAAAAFAAAAPgAAAACAAAAAAAAAAAAAAAOAAAAAAAAAAAAAAABAAAAAAAAAAgAAAAAAAAA"
    "CAAAAAAAAAAQAAAAAAAAAAEAAAAAAAAAGAAAAAAAAAAIAAAAAAAAACAAAAAAAAAAAQAAAAAAAAAoAAAAAAAAAAEAAAAAAAAA"
    "MAAAAAAAAAAIAAAAAAAAADgAAAAAAAAAAQAAAAAAAABAAAAAAAAAAAgAAAAAAAAASAAAAAAAAAABAAAAAAAAAFAAAAAAAAAA"
    "AQAAAAAAAABYAAAAAAAAAAgAAAAAAAAAYAAAAAAAAAABAAAAAAAAAGgAAAAAAAAAEAAAAAAAAAAAAAAACAAAAAIAAAAAAAAA"
    "AAAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAEAAAAAAAAA"
    "AgAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAwAAAAAAAAANAAAAAwAAAAMAAAAAAAAA"
    "jRzpQON4pd4DAAAAAAAAAAMAAAAAAAAAAAAAAAEAAAABAAAAAAAAAA4AAAAAAAAAAwAAAAAAAAABAAAAAAAAAA4AAAAAAAAA"
    "AwAAAAAAAAAAAAAAAAAAAAEAAAAAAAAA/////wAAAAA="
)


def test_a_chain_keyed_by_a_year_month_interval_merges():
    """A key with a YearMonthIntervalType field (groupBy an ANSI interval) is typed (Spark's Arrow conversion
    maps it to interval[YEAR_MONTH]), and pyarrow has no Python array class for that type: key equality views it
    as int32 to take the key apart. Without that, every load of a version with deltas and every compaction
    failed (KeyError), though the data was on disk."""
    import base64

    from spark_state.chain import merge_chain

    changes = pa.ipc.open_stream(pa.py_buffer(base64.b64decode("".join(YEAR_MONTH_CHANGES)))).read_all()
    assert tables.is_typed(changes) and changes.num_rows == 2
    merged = merge_chain([changes, changes])   # a snapshot and a delta that rewrites both keys
    assert merged.num_rows == 2
