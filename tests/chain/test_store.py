"""VersionedStore against a plain dict model, plus the failure modes the worker relies on."""

import shutil
import tempfile
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from spark_state.errors import (
    ChecksumMismatch, MaxParallelismChanged, ProtocolError, StateLost, StateTooLarge,
    VersionNotFound,
)
from spark_state.chain import VersionedStore, forget_stores, merge_chain, open_store
from spark_state.format.manifest import CompactionRecord, Manifest
from spark_state.keygroups import key_groups_of
from spark_state.options import Settings
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.layout import StoreRef
from spark_state.storage.memory import MemoryCheckpointStorage, clear_registry
from tests.support.changes import HASHES, KEYS, M, changes, checked_dict
from tests.support.stores import assert_files_of_kept_versions_exist, store_on


class Backend:
    def __init__(self, kind):
        self.kind, self.tmp = kind, tempfile.mkdtemp()
        self.root = {"file": f"file://{self.tmp}/s", "memory-fs": f"memory://{uuid.uuid4().hex}/s",
                     "memory": f"file://{self.tmp}/m"}[kind]

    def store(self, **kw):
        if self.kind == "memory":
            return store_on(MemoryCheckpointStorage(self.root, 64 << 20), **kw)
        return store_on(self.root, **kw)

    def close(self):
        if self.kind == "memory":
            clear_registry(self.root)
        elif self.kind == "memory-fs":
            st = FileSystemCheckpointStorage(self.root)
            if st.fs.exists(st._base):
                st.fs.rm(st._base.rsplit("/", 1)[0], recursive=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


value = st.one_of(st.none(), st.binary(max_size=20))
op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), value),
    st.tuples(st.just("commit")),
    st.tuples(st.just("recommit"), st.integers(0, 10)),
    st.tuples(st.just("maintenance"), st.integers(1, 4)),
    st.tuples(st.just("load"), st.integers(0, 10)),
    st.tuples(st.just("load_kg"), st.integers(0, 10), st.sets(st.integers(0, M - 1), max_size=5)),
    st.tuples(st.just("reopen")),
)


@pytest.mark.parametrize("kind", ["file", "memory-fs", "memory"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=50))
# Found by CI (stop 47): version 1 recommitted below the window after retention, then dropped by the next.
@example(ops=[("commit",)] * 4 + [("maintenance", 1), ("recommit", 0), ("maintenance", 3)])
def test_model(kind, ops):
    backend = Backend(kind)
    try:
        store = backend.store()
        model = {0: {}}              # version -> state
        pending: dict = {}
        for o in ops:
            name = o[0]
            if name == "put":
                pending[o[1]] = o[2]
            elif name in ("commit", "recommit"):
                latest = max(model)
                if name == "commit":
                    v = latest + 1
                else:
                    existing = sorted(model)
                    v = max(1, existing[o[1] % len(existing)])
                if v - 1 not in model:
                    with pytest.raises(VersionNotFound):
                        store.commit(v, changes(pending))
                    continue
                store.commit(v, changes(pending))
                state = dict(model[v - 1])
                for k, x in pending.items():
                    if x is None:
                        state.pop(k, None)
                    else:
                        state[k] = x
                model[v] = state
                pending = {}
            elif name == "maintenance":
                store.maintenance(o[1])
                # Spark's window: the versions from newest - keep + 1 up (at least two), by number, not
                # count: a recommitted old version below the window goes even when fewer are present.
                committed = [v for v in model if v > 0]
                oldest = max(committed, default=0) - max(o[1], 2) + 1
                for v in committed:
                    if v < oldest:
                        del model[v]
                assert_files_of_kept_versions_exist(store)
            elif name in ("load", "load_kg"):
                existing = sorted(model)
                v = existing[o[1] % len(existing)]
                if name == "load":
                    assert checked_dict(store.load(v)) == model[v]
                else:
                    wanted = o[2]
                    expect = {k: x for k, x in model[v].items() if HASHES[k] % M in wanted}
                    assert checked_dict(store.load(v, key_groups=sorted(wanted))) == expect
            elif name == "reopen":   # a new VersionedStore on the same root (process restart for file storage)
                store = backend.store()
            assert store.versions() == sorted(v for v in model if v > 0)
            assert store.latest_version() == (max(model) if max(model) > 0 else None)
        for v in model:
            assert checked_dict(store.load(v)) == model[v]
        missing = max(model) + 1
        with pytest.raises(VersionNotFound):
            store.load(missing)
    finally:
        backend.close()


@pytest.fixture
def fs_store(tmp_path):
    return VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"), Settings(max_parallelism=M))


def test_load_missing_version_names_store_and_versions(fs_store):
    fs_store.commit(1, changes({b"k1": b"a"}))
    fs_store.commit(2, changes({b"k1": b"b"}))
    with pytest.raises(VersionNotFound) as info:
        fs_store.load(5)
    assert "version 5" in str(info.value) and "versions present: 1-2" in str(info.value)
    assert fs_store.storage.root in str(info.value)
    with pytest.raises(VersionNotFound):
        fs_store.commit(7, changes({}))     # builds on a missing version 6
    assert fs_store.load(0).num_rows == 0


def test_crash_between_data_and_manifest_leaves_no_version(tmp_path):
    class ManifestFails(FileSystemCheckpointStorage):
        def commit_manifest(self, version, data):
            raise OSError("disk full")

    root = f"file://{tmp_path}/s"
    good = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M))
    good.commit(1, changes({b"k1": b"a"}))
    crashing = VersionedStore(ManifestFails(root), Settings(max_parallelism=M))
    with pytest.raises(OSError):
        crashing.commit(2, changes({b"k2": b"b"}))
    assert good.versions() == [1]
    with pytest.raises(VersionNotFound):
        good.load(2)
    # A process killed after the data write (no cleanup ran) leaves an orphan. Another process's abort must
    # not touch it (it could be a live commit's file); retention collects it once its version leaves the window.
    orphan = good.storage.new_file_path(2, "delta")
    good.storage.write_file(orphan, b"half a commit")
    good.abort(2)
    assert orphan in good.storage.list_files()
    good.commit(2, changes({b"k2": b"b"}))
    assert checked_dict(good.load(2)) == {b"k1": b"a", b"k2": b"b"}
    good.commit(3, changes({b"k3": b"c"}))
    good.commit(4, changes({b"k4": b"d"}))
    collector = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M, file_grace_period=0))
    collector.maintenance(2)
    assert orphan not in collector.storage.list_files()
    assert_files_of_kept_versions_exist(collector)
    assert checked_dict(collector.load(4)) == {b"k1": b"a", b"k2": b"b", b"k3": b"c", b"k4": b"d"}


def test_recommit_replaces_cleanly(fs_store):
    fs_store.commit(1, changes({b"k1": b"a"}))
    fs_store.commit(2, changes({b"k2": b"b"}))
    first = set(fs_store.storage.list_files())
    fs_store.commit(2, changes({b"k3": b"c"}))
    assert checked_dict(fs_store.load(2)) == {b"k1": b"a", b"k3": b"c"}
    assert first <= set(fs_store.storage.list_files()), "a re-commit never overwrites an existing file"
    fs_store.commit(3, changes({b"k4": b"d"}))
    fs_store.commit(4, changes({b"k5": b"e"}))
    fs_store.settings = Settings(max_parallelism=M, file_grace_period=0)
    fs_store.maintenance(2)
    assert len(fs_store.storage.list_files()) == 4, "the replaced delta is collected once version 2 leaves the window"
    assert_files_of_kept_versions_exist(fs_store)


def test_corrupted_and_truncated_files_name_the_file(tmp_path):
    store = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"), Settings(max_parallelism=M))
    store.commit(1, changes({k: b"v" * 50 for k in KEYS}))
    (path,) = store.storage.list_files()
    full = tmp_path / "s" / path
    data = full.read_bytes()
    full.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(ChecksumMismatch, match=path):
        store.load(1)
    full.write_bytes(data[:-10])
    with pytest.raises(ChecksumMismatch, match=path):
        store.load(1)
    full.write_bytes(data)
    assert len(checked_dict(store.load(1))) == len(KEYS)
    manifest = tmp_path / "s" / "chk-1" / "_metadata"
    manifest.write_bytes(manifest.read_bytes()[:-30])
    with pytest.raises(ChecksumMismatch, match="chk-1/_metadata"):
        store.load(1)


def test_max_parallelism_change_is_refused(tmp_path):
    root = f"file://{tmp_path}/s"
    VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M)).commit(1, changes({b"k1": b"a"}))
    other = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=32))
    with pytest.raises(MaxParallelismChanged, match=f"maxParallelism={M}"):
        other.load(1)
    bad = changes({b"k1": b"b"})
    bad = bad.set_column(0, "kg", pa.array(key_groups_of(bad.column("hash"), 32)))
    with pytest.raises(MaxParallelismChanged):
        other.commit(2, bad)
    with pytest.raises(ProtocolError, match="not pmod"):   # kg computed with another M than configured
        VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M)).commit(2, bad)


def test_memory_storage_limit_and_state_lost(tmp_path):
    ref = StoreRef(f"file:{tmp_path}/q/state", f"file:{tmp_path}/q/state/0/1", 0, 1)
    s = Settings(storage="memory", max_parallelism=M, memory_max_state_size=4096,
                 memory_metadata_dir=f"file://{tmp_path}/meta")
    forget_stores()
    store = open_store(ref, s)
    assert open_store(ref, s) is store
    store.commit(1, changes({b"k1": b"a"}))
    rng = np.random.default_rng(0)
    with pytest.raises(StateTooLarge, match="maxStateSize"):
        store.commit(2, changes({b"k2": rng.bytes(20_000)}))
    assert store.versions() == [1]
    clear_registry(store.storage.root)   # a new worker process: the memory is gone, the metadata dir is not
    forget_stores()
    fresh = open_store(ref, s)
    assert fresh.latest_version() == 1
    with pytest.raises(StateLost, match="storage=filesystem"):
        fresh.load(1)
    clear_registry(fresh.storage.root)
    forget_stores()


def test_compaction_failure_in_memory_is_reported_on_commit():
    root = f"compaction-limit-{uuid.uuid4().hex}"
    store = VersionedStore(MemoryCheckpointStorage(root, 6000), Settings(max_parallelism=M, snapshot_interval=2))
    rng = np.random.default_rng(0)
    for v, k in enumerate(KEYS[:4], start=1):   # each delta fits, the whole state does not
        store.commit(v, changes({k: rng.bytes(2500)}))
    store.maintenance(10)
    with pytest.raises(StateTooLarge, match="maxStateSize"):
        store.commit(5, changes({}))
    clear_registry(root)


def test_compaction_folds_chain_and_later_commits_build_on_it(fs_store):
    fs_store.settings = Settings(max_parallelism=M, snapshot_interval=3, file_grace_period=0)
    for v in range(1, 5):
        fs_store.commit(v, changes({KEYS[v]: b"%d" % v, KEYS[0]: b"%d" % v}))
    before = fs_store.storage.read_manifest(4)
    fs_store.maintenance(1)
    assert fs_store.versions() == [3, 4]
    assert fs_store.storage.read_manifest(4) == before, "compaction never rewrites a manifest"
    record = CompactionRecord.from_json(fs_store.storage.read_record(4, "_snapshot"), "4")
    assert record.commit_id == Manifest.from_json(before, "4").commit_id and record.snapshot.rows == 5
    fs_store.commit(5, changes({KEYS[1]: None}))
    manifest = Manifest.from_json(fs_store.storage.read_manifest(5), "5")
    assert [f.kind for f in manifest.files] == ["snapshot", "delta"]
    assert checked_dict(fs_store.load(5)) == {KEYS[0]: b"4", KEYS[2]: b"2", KEYS[3]: b"3", KEYS[4]: b"4"}
    fs_store.commit(6, changes({}))
    fs_store.maintenance(1)
    assert fs_store.versions() == [5, 6]
    assert len(fs_store.storage.list_files()) == 3, "the old chain is collected; snapshot + two deltas stay"
    assert_files_of_kept_versions_exist(fs_store)


@pytest.mark.parametrize("deleted", ["checkpoint", "shared", "chk-3"])
def test_compaction_leaves_a_checkpoint_deleted_meanwhile_deleted(tmp_path, monkeypatch, deleted):
    """A stopped query's checkpoint (or part of it) deleted while its worker still compacts: the compaction
    gives up quietly and nothing comes back on disk. Re-creating shared/ made the user's rm -rf fail
    ("Directory not empty") and left a stray tree in the next run's checkpoint."""
    import spark_state.chain.compaction as state_module

    root = tmp_path / "ckpt"
    store_dir = root / "state" / "0" / "1"
    store = VersionedStore(FileSystemCheckpointStorage(f"file://{store_dir}"),
                           Settings(max_parallelism=M, snapshot_interval=2))
    for v in range(1, 4):
        store.commit(v, changes({KEYS[v]: b"%d" % v}))
    victim = {"checkpoint": root, "shared": store_dir / "shared", "chk-3": store_dir / "chk-3"}[deleted]
    before = {p for p in root.rglob("*") if not p.is_relative_to(victim)}
    merge = state_module.merge_chain

    def merge_then_delete(tables):
        out = merge(tables)
        shutil.rmtree(victim)          # the user, between the compaction's reads and its write
        return out

    monkeypatch.setattr(state_module, "merge_chain", merge_then_delete)
    store.maintenance(2)
    assert not victim.exists(), sorted(str(p) for p in victim.rglob("*"))
    assert set(root.rglob("*")) <= before, "compaction wrote a file or directory (retention may delete)"
    assert store.maintenance_failures == 0 and store.maintenance_error is None
    if deleted == "checkpoint":
        # A new timeline at the same path: commits make their directories again and compaction works there.
        monkeypatch.setattr(state_module, "merge_chain", merge)
        for v in range(1, 4):
            store.commit(v, changes({KEYS[0]: b"new-%d" % v}))
        store.maintenance(2)
        assert store.storage.read_record(3, "_snapshot") is not None
        assert checked_dict(store.load(3)) == {KEYS[0]: b"new-3"}


@contextmanager
def directory_fsync_fails_once_in_place(monkeypatch, record: Path):
    """The directory fsync after `record` was renamed into place raises EIO: the rename itself landed."""
    import spark_state.storage.atomic as filesystem

    fsync_dir = filesystem.fsync_dir

    def failing(directory):
        if Path(directory) == record.parent and record.exists():
            raise OSError(5, "Input/output error")
        fsync_dir(directory)

    monkeypatch.setattr(filesystem, "fsync_dir", failing)
    try:
        yield
    finally:
        monkeypatch.setattr(filesystem, "fsync_dir", fsync_dir)


def test_a_compaction_record_that_became_visible_keeps_its_snapshot_when_the_write_then_fails(tmp_path, monkeypatch):
    """The record's rename landed but the directory's fsync raised: the compaction fails, yet the snapshot the
    visible record names must stay, or version N could no longer be read."""
    store = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"),
                           Settings(max_parallelism=M, snapshot_interval=2))
    for v in range(1, 4):
        store.commit(v, changes({KEYS[v]: b"%d" % v}))
    with directory_fsync_fails_once_in_place(monkeypatch, tmp_path / "s" / "chk-3" / "_snapshot"):
        store.maintenance(2)
    assert store.maintenance_failures == 1 and "Input/output error" in store.maintenance_error
    record = CompactionRecord.from_json(store.storage.read_record(3, "_snapshot"), "3")
    assert record.snapshot.path in store.storage.list_files()
    forget_stores()
    fresh = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"), Settings(max_parallelism=M))
    assert checked_dict(fresh.load(3)) == {KEYS[1]: b"1", KEYS[2]: b"2", KEYS[3]: b"3"}


def test_a_manifest_that_became_visible_keeps_its_files_when_the_commit_then_fails(tmp_path, monkeypatch):
    """commit_manifest's rename landed but the directory's fsync raised: the commit fails (Spark retries the
    task), yet the data file the visible manifest names must stay: a concurrent attempt of the same batch may
    have made this version the one Spark committed. The retry's re-commit replaces the manifest cleanly."""
    store = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"), Settings(max_parallelism=M))
    store.commit(1, changes({KEYS[1]: b"1"}))
    with directory_fsync_fails_once_in_place(monkeypatch, tmp_path / "s" / "chk-2" / "_metadata"):
        with pytest.raises(OSError, match="Input/output error"):
            store.commit(2, changes({KEYS[2]: b"2"}))
    forget_stores()
    fresh = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"), Settings(max_parallelism=M))
    assert checked_dict(fresh.load(2)) == {KEYS[1]: b"1", KEYS[2]: b"2"}
    fresh.commit(2, changes({KEYS[2]: b"retried"}))
    assert checked_dict(fresh.load(2)) == {KEYS[1]: b"1", KEYS[2]: b"retried"}


def test_maintenance_in_background_never_breaks_commits_or_loads(tmp_path):
    store = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"),
                           Settings(max_parallelism=M, snapshot_interval=2))
    stop = threading.Event()
    errors = []

    def maintain():
        while not stop.is_set():
            try:
                store.maintenance(2)
            except Exception as err:  # pragma: no cover - reported below
                errors.append(err)

    thread = threading.Thread(target=maintain)
    thread.start()
    model = {}
    try:
        for v in range(1, 41):
            update = {KEYS[v % len(KEYS)]: b"%d" % v, KEYS[(v * 7) % len(KEYS)]: None if v % 3 == 0 else b"x"}
            store.commit(v, changes(update))
            for k, x in update.items():
                model.pop(k, None) if x is None else model.__setitem__(k, x)
            assert checked_dict(store.load(v)) == model
    finally:
        stop.set()
        thread.join()
    assert not errors
    store.maintenance(2)
    assert store.versions() == [39, 40]
    assert_files_of_kept_versions_exist(store)


def test_merge_chain_last_write_wins_and_deletes():
    base = changes({b"k1": b"a", b"k2": b"b", b"k5": b"e"})
    d1 = changes({b"k2": None, b"k5": b"E", b"k6": b"f"})   # k5 and k6 share a hash (collision)
    d2 = changes({b"k2": b"again", b"k1": None})
    assert checked_dict(merge_chain([base, d1, d2])) == {b"k2": b"again", b"k5": b"E", b"k6": b"f"}
    assert merge_chain([]).num_rows == 0


def test_a_long_chain_on_remote_storage_is_read_several_files_at_once_in_order(monkeypatch):
    """Remote storage (here fsspec's memory://, which fsspec does not call local) reads a chain's files on
    several threads at once (a load on an object store waits one round trip per READ_AHEAD files); the state is
    exactly the one read file by file, in key-group order, and a file that cannot be read fails the load."""
    from spark_state.chain import reader

    back = Backend("memory-fs")
    try:
        store = back.store(snapshot_interval=1_000)
        assert store.storage.remote
        model: dict = {}
        for v in range(1, 21):
            batch = {KEYS[(v * 7 + i) % len(KEYS)]: (None if i == 3 and v > 1 else b"v%d-%d" % (v, i))
                     for i in range(5)}
            store.commit(v, changes(batch))
            model.update(batch)
        model = {k: val for k, val in model.items() if val is not None}
        threads: set[str] = set()
        gate = threading.Barrier(2, timeout=10)   # two reads must be under way at once to pass it
        read_file = store.storage.read_file

        def watched(path, size=None):
            threads.add(threading.current_thread().name)
            if path.endswith(".arrow") and ("v0000000002-" in path or "v0000000003-" in path):
                gate.wait()
            return read_file(path, size)

        monkeypatch.setattr(store.storage, "read_file", watched)
        assert checked_dict(store.load(20)) == model
        assert len(threads) > 1 and all(t.startswith("spark-state-read") for t in threads), threads
        store.storage.remote = False
        monkeypatch.setattr(store.storage, "read_file", read_file)
        assert checked_dict(store.load(20)) == model
        store.storage.remote = True
        monkeypatch.setattr(store.storage, "read_file",
                            lambda path, size=None: (_ for _ in ()).throw(OSError(5, "injected"))
                            if "v0000000007-" in path else read_file(path, size))
        with pytest.raises(OSError, match="injected"):
            store.load(20)
        assert reader.READ_AHEAD > 1
    finally:
        back.close()
