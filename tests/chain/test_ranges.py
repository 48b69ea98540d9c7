"""Compaction a key-group range at a time (spark_state.chain.ranges): for any chain (a sorted snapshot or one
written in arrival order, deltas in arrival order with upserts and deletes, strings that repeat and strings that
do not, a rescaled chain of slices) the snapshot and row image written range by range hold exactly what a whole
compaction writes, the snapshot is sorted with an index a key-group read uses, and repeated strings keep their
dictionary columns. Failures leave no file and no scratch behind."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.chain import ranges
from spark_state.errors import ChecksumMismatch
from spark_state.format import datafile, dictionaries, rowimage
from tests.chain.test_row_images import lazily, row_bytes
from tests.support.changes import M, typed_changes
from tests.support.stores import assert_files_of_kept_versions_exist, store_on

KEY = pa.struct([("id", pa.int64()), ("user", pa.string())])
VALUE = pa.struct([("n", pa.int64()), ("page", pa.string()), ("note", pa.string())])
#: Every snapshot gets an image; no chain is compacted unless a test asks.
SETTINGS = dict(row_images_min_rows=0, snapshot_interval=1000)


def typed(batch: dict[int, int | None]) -> pa.Table:
    """Key id -> value n (None deletes): `page` repeats (a dictionary column), `note` is mostly distinct."""
    rows = [({"id": i, "user": f"u{i % 5}"},
             None if n is None else {"n": n, "page": f"/p{n % 4}", "note": f"note {i} {n}"})
            for i, n in batch.items()]
    return typed_changes(rows, KEY, VALUE, hash_of=lambda k: (k["id"] * 2654435761) % 2 ** 32 - 2 ** 31,
                         max_parallelism=M)


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Data files of many small batches, so deltas in arrival order span every key group batch after batch and
    are split into ranges through scratch files (as a large delta is)."""
    monkeypatch.setattr(datafile, "TARGET_BATCH_BYTES", 128)


def compact(store, version: int, range_rows: int, monkeypatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(ranges, "RANGE_ROWS", range_rows)
        store.compactor.compact(version)


def private_tempdir(parent, monkeypatch):
    """A temporary directory of this test's own for the fold's scratch files (``tempfile``'s default), so its
    check that none is left sees no other process's (the suite runs on two pytest-xdist workers)."""
    scratch = parent / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def image_records(store, version: int) -> list:
    entry = store.reader.view(version).record.snapshot.image
    return list(rowimage.RowImage(store.storage.read_file(entry.path), entry.path))


batches = st.lists(st.dictionaries(st.integers(0, 80), st.none() | st.integers(0, 99), max_size=40),
                   min_size=1, max_size=5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, range_rows=st.sampled_from([1, 7, 40]), streamed_first=st.booleans())
def test_a_chain_compacted_range_by_range_is_the_chain_compacted_whole(tmp_path_factory, monkeypatch, batches,
                                                                       range_rows, streamed_first):
    """Two stores commit the same batches; one compacts by ranges of `range_rows` input rows, the other whole.
    The states, the row images' records and the key-group reads agree, and with the model."""
    root = tmp_path_factory.mktemp("ranges")
    scratch = private_tempdir(root, monkeypatch)
    stores = {name: store_on(f"file://{root}/{name}", **SETTINGS) for name in ("ranges", "whole")}
    model: dict[int, int] = {}
    for v, batch in enumerate(batches, start=1):
        for store in stores.values():
            if v == 1 and streamed_first:   # a first snapshot written while its batch ran: arrival order
                staged = store.stage(1)
                staged.append(typed(batch))
                store.commit(1, typed({}), staged=staged)
            else:
                store.commit(v, typed(batch))
        model.update(batch)
    version = len(batches)
    compact(stores["ranges"], version, range_rows, monkeypatch)
    compact(stores["whole"], version, 10 ** 9, monkeypatch)
    live = {i: n for i, n in model.items() if n is not None}
    for store in stores.values():
        assert row_bytes(store.load(version)) == (row_bytes(typed(live)) if live else {})
        assert lazily(store, version, root / "cache") == (row_bytes(typed(live)) if live else {})
    records = {name: image_records(s, version) if s.reader.view(version).record.snapshot.image else None
               for name, s in stores.items()}
    assert records["ranges"] == records["whole"]
    wanted = np.arange(0, M, 3, dtype=np.int32)
    assert row_bytes(stores["ranges"].load(version, key_groups=wanted)) == \
        row_bytes(stores["whole"].load(version, key_groups=wanted))
    assert_files_of_kept_versions_exist(stores["ranges"])
    assert not [d for d in os.listdir(scratch) if d.startswith("spark-state-fold-")], "scratch left"


def test_the_snapshot_is_sorted_and_keeps_its_repeated_strings_as_dictionaries(tmp_path, monkeypatch):
    store = store_on(f"file://{tmp_path}/s", **SETTINGS)
    store.commit(1, typed({i: i for i in range(600)}))
    store.commit(2, typed({i: i + 1000 for i in range(300, 900)} | {i: None for i in range(0, 600, 7)}))
    compact(store, 2, 50, monkeypatch)
    entry = store.reader.view(2).record.snapshot
    data = store.storage.read_file(entry.path)
    opened = datafile.IndexedFile(lambda rs: [data[a:b] for a, b in rs], entry.path, entry.index_offset,
                                  entry.index_length, entry.index_checksum, file_format=entry.file_format,
                                  max_parallelism=M, checksum=entry.checksum)
    assert opened.batches_in_key_group_order and len(opened.index) > 1
    leaves = opened.dictionaries()
    assert set(leaves) == {("key", (1,)), ("value", (1,))}, "user and page repeat; note does not"
    # every page (and maybe what a delete's empty value held in a delta's dictionary: a value of no row)
    assert {f"/p{i}" for i in range(4)} <= set(leaves[("value", (1,))].to_pylist()) <= {"", *(f"/p{i}" for i in range(4))}
    assert np.all(np.diff(datafile.decode(data, entry.path, M).column("kg").to_numpy()) >= 0)


def test_deletes_of_every_key_leave_an_empty_snapshot(tmp_path, monkeypatch):
    store = store_on(f"file://{tmp_path}/s", **SETTINGS)
    store.commit(1, typed({i: i for i in range(100)}))
    store.commit(2, typed({i: None for i in range(100)}))
    compact(store, 2, 10, monkeypatch)
    record = store.reader.view(2).record
    assert record.snapshot.rows == 0 and record.snapshot.image.rows == 0   # as a whole compaction writes (minRows 0)
    assert store.load(2).num_rows == 0 and store.load_lazy(2, cache_dir=str(tmp_path / "c")).keys == 0


def test_a_rescaled_typed_chain_is_compacted_range_by_range(tmp_path, monkeypatch):
    """Slices of other partitions' files (sorted snapshots and arrival-order deltas) give each new partition
    exactly the rows Spark routes to it."""
    from tests.chain.test_rescale_chain import Checkpoint

    ckpt = Checkpoint(tmp_path, M, snapshot_interval=1000, row_images_min_rows=0)
    model: dict[int, int] = {}
    for v, batch in enumerate([{i: i for i in range(200)}, {i: -i for i in range(50, 250)} | {3: None}], start=1):
        full = typed(batch)
        for p in range(2):
            mine = full.filter(pa.array(np.mod(full.column("hash").to_numpy().astype(np.int64), 2) == p))
            ckpt.store(p).commit(v, mine)
        model.update(batch)
    ckpt.rescale(2, 4, 2)
    live = typed({i: n for i, n in model.items() if n is not None})
    hashes = live.column("hash").to_numpy().astype(np.int64)
    for p in range(4):
        store = ckpt.store(p)
        assert any(f.is_slice for f in store.reader.read_manifest(3).files)
        compact(store, 3, 20, monkeypatch)
        record = store.reader.view(3).record
        assert record is not None and not record.snapshot.is_slice and record.snapshot.image is not None
        expected = row_bytes(live.filter(pa.array(np.mod(hashes, 4) == p)))
        assert row_bytes(store.load(3)) == expected == lazily(store, 3, tmp_path / "cache")


def test_a_damaged_delta_fails_the_compaction_and_leaves_no_file(tmp_path, monkeypatch):
    scratch = private_tempdir(tmp_path, monkeypatch)
    store = store_on(f"file://{tmp_path}/s", **SETTINGS)
    store.commit(1, typed({i: i for i in range(300)}))
    store.commit(2, typed({i: i + 1 for i in range(300)}))
    before = set(store.storage.list_files())
    delta = store.reader.read_manifest(2).files[1]
    path = tmp_path / "s" / delta.path
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10   # inside a batch: its CRC fails while the delta is split into ranges
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match=delta.path):
        compact(store, 2, 25, monkeypatch)
    assert set(store.storage.list_files()) == before and store.reader.view(2).record is None
    assert not any(name.startswith("spark-state-fold-") for name in os.listdir(scratch))


def test_fixed_dictionaries_keep_only_what_every_input_allows():
    """A column stored plain by a sorted input, mostly distinct in a batch, or past the limit is not encoded;
    a value missing from a fixed dictionary is refused, never written as null."""
    schema = typed({1: 1}).schema
    fixed = dictionaries.FixedDictionaries(schema, max_values=1000)
    fixed.take_file({("value", (1,)): pa.array(["/a", "/b"]), ("key", (1,)): pa.array(["u0"])})   # note: plain
    fixed.collect(typed({i: i for i in range(200)}))
    got = fixed.fixed()
    assert set(got) == {("key", (1,)), ("value", (1,))}
    assert set(got[("value", (1,))].to_pylist()) == {"/a", "/b", "/p0", "/p1", "/p2", "/p3"}
    assert dictionaries.FixedDictionaries(schema, max_values=3).fixed() == {}   # nothing collected: no column
    small = dictionaries.FixedDictionaries(schema, max_values=4)
    small.collect(typed({i: i for i in range(200)}))
    assert set(small.fixed()) == {("value", (1,))}, "user has 5 values, over the limit of 4; page has 4"
    table = typed({5: 6}).drop_columns(["kg"])
    with pytest.raises(ValueError, match="outside the file's fixed dictionary"):
        dictionaries.encode_fixed(table, {("value", (1,)): pa.array(["/p0"])})
    encoded = dictionaries.encode_fixed(table, got)
    assert dictionaries.decode(encoded).equals(table)


@pytest.mark.parametrize("deleted", ["checkpoint", "shared", "chk-2"])
def test_a_checkpoint_deleted_while_it_is_compacted_range_by_range_stays_deleted(tmp_path, monkeypatch, deleted):
    """As for a whole compaction (tests/chain/test_store.py): the user's rm -rf between the compaction's reads
    and its writes; it gives up quietly, brings back no file or directory, and leaves no scratch."""
    import shutil

    root = tmp_path / "ckpt"
    store_dir = root / "state" / "0" / "1"
    store = store_on(f"file://{store_dir}", **SETTINGS)
    store.commit(1, typed({i: i for i in range(300)}))
    store.commit(2, typed({i: i + 1 for i in range(300)}))
    victim = {"checkpoint": root, "shared": store_dir / "shared", "chk-2": store_dir / "chk-2"}[deleted]
    before = {p for p in root.rglob("*") if not p.is_relative_to(victim)}
    enter = ranges.RangeFold.__enter__

    def enter_then_delete(self):
        fold = enter(self)
        shutil.rmtree(victim)
        return fold

    monkeypatch.setattr(ranges.RangeFold, "__enter__", enter_then_delete)
    monkeypatch.setattr(ranges, "RANGE_ROWS", 50)
    store.maintenance(2)
    assert not victim.exists(), sorted(str(p) for p in victim.rglob("*"))
    assert set(root.rglob("*")) <= before, "compaction wrote a file or directory"
    assert store.maintenance_failures == 0 and store.maintenance_error is None
