"""File format 2 (typed key and value struct columns): round trips, key-group subsets, merges
against a dict model, and a store turning a format-1 chain into typed files."""

from __future__ import annotations

import datetime as dt
import decimal
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.chain import merge as state, merge_chain
from spark_state.errors import ProtocolError
from spark_state.format import datafile as snapshot, tables
from spark_state.format.manifest import SNAPSHOT, Manifest, ManifestFormat
from spark_state.format.tables import CHANGES_SCHEMA
from tests.support.changes import M, opaque_changes, typed_changes
from tests.support.stores import store_on

SMALL_DELTAS = state._SMALL_DELTAS
#: A key like a session window's: (user, nested window), nullable fields; an array field (dictionary encoding
#: cannot key it, so key equality falls back to Python values).
KEY = pa.struct([("user", pa.string()), ("window", pa.struct([("start", pa.timestamp("us", "UTC")),
                                                              ("end", pa.timestamp("us", "UTC"))])),
                 ("tags", pa.list_(pa.int32()))])
VALUE = pa.struct([("total", pa.int64()), ("price", pa.decimal128(20, 4)), ("name", pa.string()),
                   ("state", pa.struct([("n", pa.int64()), ("seen", pa.timestamp("us", "UTC"))])),
                   ("timeoutTimestamp", pa.int64())])
SCHEMA = tables.typed_schema(KEY, VALUE)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

users = st.sampled_from(["a", "b", "", "ü", None])
windows = st.one_of(st.none(), st.integers(0, 2).map(
    lambda i: {"start": T0 + dt.timedelta(seconds=10 * i), "end": T0 + dt.timedelta(seconds=10 * i + 10)}))
tags = st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=2))
keys = st.fixed_dictionaries({"user": users, "window": windows, "tags": tags})
values = st.fixed_dictionaries({
    "total": st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
    "price": st.one_of(st.none(), st.decimals(-10**6, 10**6, places=4)),
    "name": st.one_of(st.none(), st.text(max_size=12)),
    "state": st.one_of(st.none(), st.fixed_dictionaries({"n": st.integers(0, 9), "seen": st.just(T0)})),
    "timeoutTimestamp": st.integers(-1, 10**13)})


def _hash(key: dict) -> int:
    """Deliberately coarse (the user only, like a session window's prefix hash): many keys share one."""
    return {"a": 5, "b": -5, "": 2**31 - 1, "ü": -(2**31), None: 7}[key["user"]]


def _frozen(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_frozen(x) for x in v)
    return v


def table(rows: list[tuple[dict, dict | None]]) -> pa.Table:
    return typed_changes(rows, KEY, VALUE, hash_of=_hash, max_parallelism=M)


def as_dict(t: pa.Table) -> dict:
    assert t.column("value").null_count == 0
    out = {}
    for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist()):
        assert _frozen(k) not in out, "a key appears twice"
        out[_frozen(k)] = _frozen(v)
    return out


batches = st.lists(st.dictionaries(keys.map(_frozen), st.one_of(st.none(), values), max_size=8), min_size=1,
                   max_size=5)


def _thaw(key):
    return {name: (dict(v) if isinstance(v, tuple) and name == "window" else
                   (list(v) if isinstance(v, tuple) else v)) for name, v in key}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_merge_chain_of_typed_rows_matches_a_dict(chain):
    model: dict = {}   # key -> value, frozen
    tables = []
    for step in chain:
        rows = [(_thaw(k), v) for k, v in step.items()]
        tables.append(table(rows))
        for k, v in step.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = _frozen(v)
    tables[0] = tables[0].filter(tables[0].column("value").is_valid())   # a snapshot holds no deletes
    tables = [t.take(np.argsort(t.column("kg").to_numpy(), kind="stable")) for t in tables]   # files: kg order
    for small_deltas in (0, 10**9):   # both folds: deltas looked up in the base by hash, and one pass over all
        state._SMALL_DELTAS = small_deltas
        try:
            merged = merge_chain(tables)
            unordered = merge_chain(tables, ordered=False)
        finally:
            state._SMALL_DELTAS = SMALL_DELTAS
        assert (np.diff(merged.column("kg").to_numpy()) >= 0).all()
        assert as_dict(merged) == model
        assert as_dict(unordered) == model


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys.map(_frozen), values, max_size=40), st.sets(st.integers(0, M - 1)),
       st.sampled_from([64, 1 << 20]), st.booleans(), st.randoms(use_true_random=False))
def test_typed_file_round_trip_and_key_group_subsets(state, wanted, target, arrival_order, rnd):
    """Sorted files and arrival-order deltas (rows shuffled as a hash map hands them over) read the same."""
    rows = [(_thaw(k), v) for k, v in state.items()]
    rnd.shuffle(rows)
    t = table(rows)
    enc = snapshot.encode(t, -3 if arrival_order else 3, target_batch_bytes=target, arrival_order=arrival_order)
    assert enc.file_format == snapshot.FileFormat.TYPED and enc.rows == len(state)
    snapshot.check_whole(enc.data, "f", enc.size, enc.checksum)
    assert "kg" not in pa.ipc.open_stream(pa.py_buffer(enc.data)).schema.names, "kg is derived, not stored"
    full = snapshot.decode(enc.data, "f", M)
    assert full.schema == SCHEMA and as_dict(full) == as_dict(t)
    if arrival_order:
        assert full.column("key").to_pylist() == t.column("key").to_pylist(), "rows keep the order given"
    assert snapshot.read_trailer(enc.data, "f") == (enc.index_offset, enc.index_length)
    fetch = lambda ranges: [enc.data[a:b] for a, b in ranges]   # noqa: E731
    sub = snapshot.read_key_groups(fetch, "f", enc.index_offset, enc.index_length, enc.index_checksum,
                                   np.array(sorted(wanted), dtype=np.int32), file_format=enc.file_format,
                                   max_parallelism=M)
    assert sub.schema == SCHEMA
    assert as_dict(sub) == as_dict(t.filter(pa.array(np.isin(t.column("kg").to_numpy(), list(wanted)))))


def _opaque(pending: dict) -> pa.Table:
    return opaque_changes(pending, max_parallelism=M)


def test_a_format_1_chain_becomes_typed_by_one_full_commit_and_typed_manifests_are_format_4():
    a = ({"user": "a", "window": None, "tags": None},
         {"total": 1, "price": decimal.Decimal("1.5000"), "name": "x", "state": None, "timeoutTimestamp": -1})
    b = ({"user": "b", "window": None, "tags": [1]},
         {"total": 2, "price": None, "name": None, "state": {"n": 1, "seen": T0}, "timeoutTimestamp": 9})
    with tempfile.TemporaryDirectory() as tmp:
        store = store_on(f"file://{tmp}/s")
        c1 = store.commit(1, _opaque({b"k1": b"v1"}))
        c2 = store.commit(2, _opaque({b"k22": b"v2"}), base_commit_id=c1.commit_id)
        with pytest.raises(ProtocolError, match="full=true"):
            store.commit(3, table([a]), base_commit_id=c2.commit_id)
        c3 = store.commit(3, table([a, b]), base_commit_id=c2.commit_id, full=True)
        manifest = Manifest.from_json(store.storage.read_manifest(3), "m")
        assert manifest.format == ManifestFormat.TYPED and len(manifest.files) == 1
        assert manifest.files[0].kind == SNAPSHOT and manifest.files[0].typed
        assert Manifest.from_json(store.storage.read_manifest(2), "m").format == 2, "format-1 chains keep format 2"
        c4 = store.commit(4, table([(a[0], None)]), base_commit_id=c3.commit_id)
        assert as_dict(store.load(4)) == as_dict(table([b]))
        assert store.load(2).schema == CHANGES_SCHEMA, "format-1 versions still load as they were written"
        store.commit(5, table([a]), base_commit_id=c4.commit_id)
        store.maintenance(2, 5)   # compacts the typed chain
        assert as_dict(store.load(5)) == as_dict(table([a, b]))


def test_read_state_names_repeated_struct_fields_apart_and_keeps_their_values():
    from spark_state.lifecycle.reading import as_table_of as _as, unique_names as _unique_names

    value = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([3, 4]), pa.array(["x", "y"])],
                                       fields=[pa.field("sum", pa.int64()), pa.field("sum", pa.int64()),
                                               pa.field("last", pa.string())])
    t = pa.table({"partition": pa.array([0, 1], pa.int32()), "key": pa.array([{"k": "a"}, {"k": "b"}]),
                  "value": value})
    named = _as(t, _unique_names(t.schema))
    assert named.schema.field("value").type.names == ["sum", "sum_2", "last"]
    assert named.column("value").to_pylist() == [{"sum": 1, "sum_2": 3, "last": "x"}, {"sum": 2, "sum_2": 4, "last": "y"}]


def test_a_chain_whose_schema_changed_nullability_loads_with_deletes_in_its_deltas():
    """Found by the soak (benchmarks/soak): a stream-stream join restored from a savepoint declares its state
    with other nullability than the files it restores (``oid string not null`` then ``oid string``). A delta
    that deleted rows holds a null value struct whose non-nullable children are null there too; relabelling
    it to the newest schema with Arrow's ``view`` failed ("nulls in input cannot be viewed as non-nullable"),
    so every load of that store failed and the query could never run again."""
    key = pa.struct([pa.field("k", pa.string(), False)])
    strict = pa.struct([pa.field("oid", pa.string(), False), pa.field("lt", pa.timestamp("us", "UTC"), False),
                        pa.field("matched", pa.bool_())])
    loose = pa.struct([pa.field("oid", pa.string()), pa.field("lt", pa.timestamp("us", "UTC"), False),
                       pa.field("matched", pa.bool_())])

    def rows(pairs, value_type):
        """Changes as the shim writes them: a deleted row's value is null, and so are its children."""
        t = typed_changes(pairs, key, value_type, hash_of=lambda k: len(k["k"]), max_parallelism=M)
        deleted = pa.array([v is None for _, v in pairs])
        children = [pa.array([None if v is None else v[f.name] for _, v in pairs], f.type) for f in value_type]
        values = pa.StructArray.from_arrays(children, fields=list(value_type), mask=deleted)
        return t.set_column(t.schema.get_field_index("value"), t.schema.field("value"), values)

    a, b, c = {"k": "a"}, {"k": "bb"}, {"k": "ccc"}
    value = {"oid": "o1", "lt": T0, "matched": False}
    with tempfile.TemporaryDirectory() as tmp:
        store = store_on(f"file://{tmp}/s", snapshot_interval=100)
        c1 = store.commit(1, rows([(a, value), (b, value)], strict))
        c2 = store.commit(2, rows([(a, None), (c, value)], strict), base_commit_id=c1.commit_id)   # a delete
        store.commit(3, rows([(b, {**value, "matched": True})], loose), base_commit_id=c2.commit_id)
        loaded = store_on(f"file://{tmp}/s", snapshot_interval=100).load(3)
        assert loaded.schema.field("value").type == loose
        state = {k["k"]: v for k, v in zip(loaded.column("key").to_pylist(), loaded.column("value").to_pylist())}
        assert state == {"bb": {**value, "matched": True}, "ccc": value}
