"""Exact key counts per version (issue 35): the count a shim sends with a commit is recorded in the manifest
(``rows``, no format change) and answered by every load, as is a whole snapshot's; a lazy load (a row image
and the changes after it) that knows no count says so (None) rather than guess, and a load of every row
counts what it read. A model run with random batches, counts sent or not, and compactions checks that every
count answered is the model's."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from spark_state.errors import ProtocolError, VersionNotFound
from spark_state.format.manifest import Manifest, ManifestFormat
from tests.chain.test_rescale_chain import Checkpoint, table as opaque_table
from tests.support.changes import M, typed_changes
from tests.support.stores import store_on

#: Row images for any snapshot (a lazy load), long chains (no compaction unless a test asks for it).
LAZY = dict(row_images_min_rows=0, snapshot_interval=100)
KEY = pa.struct([("k", pa.int64())])
VALUE = pa.struct([("sum", pa.int64()), ("count", pa.int64())])


def changes(batch: dict[int, int | None]) -> pa.Table:
    """An aggregation's typed changes: key k -> (sum, count), None deletes k."""
    rows = [({"k": k}, None if v is None else {"sum": v, "count": 1}) for k, v in batch.items()]
    return typed_changes(rows, KEY, VALUE, hash_of=lambda key: key["k"] * 7919 % 1000 - 500, max_parallelism=M)


def counts(store, version: int, cache) -> tuple[int | None, int | None]:
    """(the lazy load's count, the whole load's count) of `version`."""
    return (store.load_lazy(version, cache_dir=str(cache)).keys, store.load_checked(version, ordered=False).keys)


def test_a_commit_records_the_count_it_is_sent_and_loads_answer_it(tmp_path):
    store = store_on(f"file://{tmp_path}/s", **LAZY)
    store.commit(1, changes({i: i for i in range(10)}))
    store.maintenance(10, 1)   # the snapshot's row image
    store.commit(2, changes({3: None, 4: None, 20: 1}), keys=9)
    store.commit(3, changes({5: 50}))   # a shim that did not count
    assert store.load_lazy(3, cache_dir=str(tmp_path)).image is not None
    assert store.reader.read_manifest(1).rows == 10   # a snapshot knows its rows
    assert store.reader.read_manifest(2).rows == 9 and store.reader.read_manifest(3).rows is None
    assert counts(store, 1, tmp_path) == (10, 10)
    assert counts(store, 2, tmp_path) == (9, 9)
    assert counts(store, 3, tmp_path) == (None, 9)   # the image and the changes do not say; every row does
    commit_id = store.reader.read_manifest(2).commit_id
    unchanged = store.load_checked(2, commit_id)
    assert unchanged.table is None and unchanged.keys == 9
    assert store.load_lazy(2, commit_id, cache_dir=str(tmp_path)).keys == 9
    assert store.load_checked(0).keys == 0


def test_the_count_adds_no_manifest_format():
    """Older readers read ``rows`` as they always did: a delta chain with a count is still format 2."""
    from tests.unit.test_golden_layout import _entry

    snap = _entry(path="shared/v0000000001-snapshot-aabbccddeeff0011.arrow", kind="snapshot", version=1)
    manifest = Manifest(3, M, (snap, _entry()), 1234, commit_id="c0ffee0000000001", query_id="q-1")
    assert manifest.format == ManifestFormat.PLAIN
    assert Manifest.from_json(manifest.to_json(), "m").rows == 1234


def test_a_whole_state_commit_knows_its_count_and_refuses_a_wrong_one(tmp_path):
    store = store_on(f"file://{tmp_path}/s")
    with pytest.raises(ProtocolError, match="counts 3 keys, but the state it sent holds 2"):
        store.commit(1, changes({1: 1, 2: 2, 3: None}), keys=3)
    with pytest.raises(VersionNotFound):
        store.reader.read_manifest(1)
    store.commit(1, changes({1: 1, 2: 2, 3: None}), keys=2)
    store.commit(2, changes({4: 4}), keys=3)
    store.commit(3, changes({i: i for i in range(7)}), full=True)   # the whole state, a new chain
    assert store.reader.read_manifest(3).rows == 7 and counts(store, 3, tmp_path) == (7, 7)
    with pytest.raises(ProtocolError, match="counts 6 keys"):
        store.commit(4, changes({i: i for i in range(7)}), full=True, keys=6)


@pytest.mark.parametrize("keys", [-1, True, 1.5, "5"])
def test_a_count_that_is_not_a_count_is_refused(tmp_path, keys):
    store = store_on(f"file://{tmp_path}/s")
    with pytest.raises(ProtocolError, match="must be an integer >= 0"):
        store.commit(1, changes({1: 1}), keys=keys)


def test_a_compacted_chain_knows_its_count_without_one_sent(tmp_path):
    store = store_on(f"file://{tmp_path}/s", **LAZY)
    store.commit(1, changes({i: i for i in range(10)}))
    store.maintenance(10, 1)
    store.commit(2, changes({0: None}))
    store.commit(3, changes({1: None, 30: 3}))
    assert counts(store, 3, tmp_path) == (None, 9)
    store.update_settings(dataclasses.replace(store.settings, snapshot_interval=2))
    store.maintenance(10, 3)
    assert store.reader.view(3).record is not None
    assert counts(store, 3, tmp_path) == (9, 9)


def test_a_rescaled_chain_has_no_count_until_sent(tmp_path):
    """A rescale writes manifests of slices of other partitions' files: their counts are unknown, and a load of
    such a chain reads every row (no image stands for a slice), so it counts them."""
    ckpt = Checkpoint(tmp_path, 8, snapshot_interval=100)
    rows = {b"k%07d" % i: (i * 7919 - 40_000, b"v" * 8) for i in range(40)}
    for p in range(2):
        mine = {k: hv for k, hv in rows.items() if hv[0] % 2 == p}
        ckpt.store(p).commit(1, opaque_table(mine, 8))
    ckpt.rescale(2, 4, 1)
    for p in range(4):
        store = ckpt.store(p)
        expected = sum(1 for h, _ in rows.values() if h % 4 == p)
        assert store.reader.read_manifest(2).rows is None and store.reader.view(2).keys is None
        assert counts(store, 2, tmp_path) == (expected, expected)
        store.commit(3, opaque_table({b"new%05d" % p: (p, b"x" * 8)}, 8), keys=expected + 1)
        assert store.reader.read_manifest(3).rows == expected + 1
        assert counts(store, 3, tmp_path) == (expected + 1, expected + 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.tuples(st.dictionaries(st.integers(0, 60), st.none() | st.integers(0, 99), max_size=25),
                                  st.booleans(), st.booleans()), min_size=1, max_size=10))
def test_every_count_answered_is_the_models(tmp_path_factory, batches):
    """Batches of upserts and deletes; the 'shim' sends its exact count or not, maintenance runs or not.
    Every count a load answers is the model's; a lazy load knows it whenever it was sent or the version is
    one whole snapshot (a first version, or compacted)."""
    tmp = tmp_path_factory.mktemp("counts")
    store = store_on(f"file://{tmp}/s", row_images_min_rows=0, snapshot_interval=3)
    model: dict[int, int] = {}
    for version, (batch, send, maintain) in enumerate(batches, start=1):
        model.update(batch)
        model = {k: v for k, v in model.items() if v is not None}
        store.commit(version, changes(batch), keys=len(model) if send else None)
        if maintain:
            store.maintenance(10, version)
        lazy = store.load_lazy(version, cache_dir=str(tmp))
        assert store.load_checked(version, ordered=False).keys == len(model)
        view = store.reader.view(version)
        one_snapshot = len(view.chain) == 1 and view.chain[0].kind == "snapshot"
        known = send or one_snapshot or lazy.image is None   # no image: every row was loaded, and counted
        assert lazy.keys == (len(model) if known else None)
        event(f"count known: {known}")
