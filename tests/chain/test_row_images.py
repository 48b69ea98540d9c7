"""Row images in the chain: compaction writes one beside each big enough snapshot, a lazy load names it and
hands over only the changes after it, and image plus changes are exactly the state a full load returns, for
every version of a model run. An image is never the truth: a missing or damaged one costs only the laziness.
Retention keeps the images kept versions name and collects the others like any data file."""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.chain.compaction import DELTA_ROWS_SHARE
from spark_state.format import rowimage, unsaferow
from tests.support.changes import M, changes_table, typed_changes
from tests.support.stores import assert_files_of_kept_versions_exist, store_on

KEY = pa.struct([("id", pa.int64()), ("name", pa.string())])
VALUE = pa.struct([("n", pa.int64()), ("s", pa.string())])
IMAGES = dict(row_images_min_rows=0, snapshot_interval=3)


def key_of(i: int) -> dict:
    return {"id": i, "name": f"user-{i % 7}"}


def typed(pending: dict[int, int | None]) -> pa.Table:
    """Typed changes of keys key_of(i) -> value (n, s) (None: delete), hashed so that some keys collide."""
    rows = [(key_of(i), None if v is None else {"n": v, "s": "x" * (v % 5)}) for i, v in pending.items()]
    return typed_changes(rows, KEY, VALUE, hash_of=lambda k: k["id"] % 11 - 5, max_parallelism=M)


def row_bytes(table: pa.Table) -> dict[bytes, bytes | None]:
    """UnsafeRow bytes of each row's key -> of its value (None: a delete)."""
    k_off, k_data = unsaferow.encode(table.column("key").combine_chunks())
    valid = table.column("value").is_valid().to_numpy(zero_copy_only=False)
    values = table.column("value").combine_chunks()
    v_off, v_data = unsaferow.encode(values)
    return {k_data[k_off[i]:k_off[i + 1]].tobytes(): (v_data[v_off[i]:v_off[i + 1]].tobytes() if valid[i] else None)
            for i in range(table.num_rows)}


def lazily(store, version: int, cache_dir) -> dict[bytes, bytes]:
    """The state a JVM looking keys up in the row image sees: the image's records, then the changes after it."""
    loaded = store.load_lazy(version, cache_dir=str(cache_dir))
    if loaded.image is None:
        return row_bytes(loaded.table)
    with open(loaded.image.path, "rb") as f:
        image = rowimage.RowImage(f.read(), loaded.image.path)
    state = {r.key: r.value for r in image}
    assert None not in state.values(), "a snapshot's image holds no tombstones"
    for k, v in ({} if loaded.table is None else row_bytes(loaded.table)).items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state


def test_compaction_writes_an_image_and_a_lazy_load_names_it(tmp_path):
    store = store_on(f"file://{tmp_path}/s", **IMAGES)
    model: dict[int, int] = {}
    for v in range(1, 7):
        batch = {i: v * 10 + i for i in range(v, v + 20)} | {v - 1: None}
        store.commit(v, typed(batch))
        model.update(batch)
        store.maintenance(10, v)
    live = {i: x for i, x in model.items() if x is not None}
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"))
    assert loaded.image is not None and not loaded.image.temporary
    assert loaded.image.path.startswith(str(tmp_path / "s" / "shared")) and loaded.image.path.endswith(".img")
    expected = row_bytes(typed(live))
    assert lazily(store, 6, tmp_path / "cache") == expected == row_bytes(store.load(6))
    assert_files_of_kept_versions_exist(store)


def test_a_load_counts_the_bytes_it_read_from_storage(tmp_path):
    """``bytes_read`` (the load reply's bytesRead, the sparkStateBytesRead metric): the chain's files of a whole
    load; of a lazy one only the changes' files when the image is read in place, plus the image when it had to be
    downloaded; nothing when the caller's copy is current."""
    for url in (f"file://{tmp_path}/s", f"memory://{tmp_path.name}-bytes"):
        store = store_on(url, **IMAGES)
        for v in range(1, 7):
            store.commit(v, typed({i: v * 10 + i for i in range(v, v + 20)} | {v - 1: None}))
            if v <= 4:   # versions 5 and 6 stay deltas on the snapshot maintenance wrote
                store.maintenance(10, v)
        chain = store.reader.view(6).chain
        assert len(chain) > 1 and chain[0].image is not None, "the test needs a snapshot with an image and deltas"
        changes = sum(f.size for f in chain[1:])
        whole = store.load_checked(6)
        assert whole.bytes_read == changes + chain[0].size
        lazy = store.load_lazy(6, cache_dir=str(tmp_path / "cache"))
        downloaded = chain[0].image.size if lazy.image.temporary else 0
        assert lazy.image.temporary == url.startswith("memory:"), "memory:// has no local path: its image is copied"
        assert lazy.bytes_read == changes + downloaded
        assert store.load_lazy(6, whole.commit_id, cache_dir=str(tmp_path / "cache")).bytes_read == 0
        assert store.load_checked(6, whole.commit_id).bytes_read == 0


def test_a_store_whose_chain_is_one_snapshot_gets_only_its_image(tmp_path):
    store = store_on(f"file://{tmp_path}/s", **IMAGES)
    store.commit(1, typed({i: i for i in range(50)}))
    snapshot_file = store.reader.read_manifest(1).files[0].path
    store.maintenance(10, 1)
    record = store.reader.view(1).record
    assert record is not None and record.snapshot.path == snapshot_file, "the snapshot is kept, not rewritten"
    assert record.snapshot.image is not None and record.snapshot.image.rows == 50
    store.commit(2, typed({0: None, 1: 100}))
    assert store.reader.read_manifest(2).files[0].image == record.snapshot.image, "later chains carry the image"
    assert lazily(store, 2, tmp_path / "c") == row_bytes(store.load(2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.dictionaries(st.integers(0, 30), st.none() | st.integers(0, 99), max_size=12),
                          st.booleans()), min_size=1, max_size=9))
def test_image_plus_changes_is_every_versions_state(tmp_path_factory, batches):
    """Any run of commits and maintenance: each version read lazily equals its full load and the model."""
    root = tmp_path_factory.mktemp("model")
    store = store_on(f"file://{root}/s", **IMAGES)
    model: dict[int, int] = {}
    states = {}
    for v, (batch, maintain) in enumerate(batches, start=1):
        store.commit(v, typed(batch))
        model.update(batch)
        states[v] = {i: x for i, x in model.items() if x is not None}
        if maintain:
            store.maintenance(100, v)
    for v, state in states.items():
        expected = row_bytes(typed(state)) if state else {}
        assert lazily(store, v, root / "cache") == expected, f"version {v}"


def test_deltas_holding_half_the_snapshots_rows_are_compacted_however_short_the_chain(tmp_path):
    store = store_on(f"file://{tmp_path}/s", row_images_min_rows=10, snapshot_interval=100)
    store.commit(1, typed({i: i for i in range(40)}))
    store.maintenance(10, 1)   # the first snapshot gets its image
    assert store.reader.view(1).record.snapshot.image is not None
    store.commit(2, typed({i: 1 for i in range(int(40 * DELTA_ROWS_SHARE) - 1)}))
    store.maintenance(10, 2)
    assert store.reader.view(2).record is None, "a small delta is not worth a compaction"
    store.commit(3, typed({i: 2 for i in range(5)}))
    store.maintenance(10, 3)
    assert store.reader.view(3).record is not None, "deltas holding half the snapshot's rows: compacted"


@pytest.mark.parametrize("why", ["memory storage", "few rows", "turned off"])
def test_no_image_where_it_cannot_help(tmp_path, why):
    if why == "memory storage":
        from spark_state.storage.memory import MemoryCheckpointStorage

        store = store_on(MemoryCheckpointStorage(f"file://{tmp_path}/m", 1 << 30, None), **IMAGES)
    else:
        options = {"few rows": dict(row_images_min_rows=1000), "turned off": dict(row_images=False)}[why]
        store = store_on(f"file://{tmp_path}/s", **{**IMAGES, **options})
    for v in range(1, 5):
        store.commit(v, typed({i: v for i in range(20)}))
        store.maintenance(10, v)
    assert store.load_lazy(4, cache_dir=str(tmp_path / "c")).image is None
    assert not [p for p in store.storage.list_files() if p.endswith(".img")]


def test_a_type_without_an_unsaferow_encoding_gets_no_image_and_is_not_read_again(tmp_path, caplog):
    store = store_on(f"file://{tmp_path}/s", **IMAGES)
    value = pa.struct([("tags", pa.list_(pa.string()))])
    rows = [({"id": i, "name": "a"}, {"tags": ["x"] * i}) for i in range(30)]
    with caplog.at_level(logging.INFO, logger="spark_state.chain.compaction"):
        store.commit(1, typed_changes(rows, KEY, value, hash_of=lambda k: k["id"], max_parallelism=M))
        store.maintenance(10, 1)
        store.commit(2, typed_changes(rows[:3], KEY, value, hash_of=lambda k: k["id"], max_parallelism=M))
        store.maintenance(10, 2)
    assert "tags" in store.compactor.no_image
    assert sum("no row images" in r.message for r in caplog.records) == 1
    assert store.reader.view(2).record is None, "no compaction just to find out again"
    assert store.load_lazy(2, cache_dir=str(tmp_path / "c")).image is None


def test_opaque_rows_are_imaged_as_they_are(tmp_path):
    store = store_on(f"file://{tmp_path}/s", **IMAGES)
    keys = [bytes([i]) * 16 for i in range(30)]
    store.commit(1, changes_table([i * 37 for i in range(30)], keys, [b"v" * 8 * (i % 3 + 1) for i in range(30)],
                                  max_parallelism=M))
    store.maintenance(10, 1)
    loaded = store.load_lazy(1, cache_dir=str(tmp_path / "c"))
    assert loaded.image is not None and loaded.file_format == 1
    with open(loaded.image.path, "rb") as f:
        assert {r.key: r.value for r in rowimage.RowImage(f.read(), "img")} == \
            dict(zip(keys, (b"v" * 8 * (i % 3 + 1) for i in range(30))))


def test_a_damaged_or_missing_image_only_costs_the_laziness(tmp_path, caplog):
    store = store_on(f"file://{tmp_path}/s", **IMAGES)
    store.commit(1, typed({i: i for i in range(40)}))
    store.maintenance(10, 1)
    image = store.load_lazy(1, cache_dir=str(tmp_path / "c")).image
    with open(image.path, "ab") as f:
        f.write(b"\0" * 8)   # not the size its entry says
    with caplog.at_level(logging.WARNING):
        loaded = store.load_lazy(1, cache_dir=str(tmp_path / "c"))
    assert loaded.image is None and row_bytes(loaded.table) == row_bytes(typed({i: i for i in range(40)}))
    assert "loading the rows instead" in caplog.text
    os.unlink(image.path)
    loaded = store.load_lazy(1, cache_dir=str(tmp_path / "c"))
    assert loaded.image is None and loaded.table.num_rows == 40


def test_an_image_in_remote_storage_is_copied_next_to_the_jvm(tmp_path):
    url = f"memory://{tmp_path.name}/s"
    store = store_on(url, **IMAGES)
    store.commit(1, typed({i: i for i in range(40)}))
    store.maintenance(10, 1)
    loaded = store.load_lazy(1, cache_dir=str(tmp_path / "cache"))
    assert loaded.image.temporary and loaded.image.path.startswith(str(tmp_path / "cache"))
    entry = store.reader.view(1).record.snapshot.image
    with open(loaded.image.path, "rb") as f:
        assert f.read() == store.storage.read_file(entry.path)


def test_retention_keeps_the_images_kept_versions_name_and_collects_the_rest(tmp_path):
    store = store_on(f"file://{tmp_path}/s", **IMAGES)
    for v in range(1, 13):
        store.commit(v, typed({i: v for i in range(v, v + 15)}))
        store.maintenance(2, v)
    images = {p for p in store.storage.list_files() if p.endswith(".img")}
    named = set()
    for v in store.versions():
        view = store.reader.view(v)
        named.update(p for f in view.manifest.files for p in f.paths if p.endswith(".img"))
        if view.record is not None:
            named.update(p for p in view.record.snapshot.paths if p.endswith(".img"))
    assert images == named and images, "every image left is named by a kept version, and some are"
    assert_files_of_kept_versions_exist(store)
