"""The cross-process rules of docs/consistency.md, one store object per "process" on one root.

Each VersionedStore below stands for a different worker process: they share
nothing but storage, exactly as two executors do. (The same rules under real
processes and Spark: tests/worker/test_multiprocess_model.py and tests/cluster/.)
"""

from __future__ import annotations

import json
import logging
import os
import stat

import pyarrow as pa
import pytest

from spark_state.chain import VersionedStore, forget_stores, merge_chain, open_store
from spark_state.errors import ProtocolError, StaleState, StorageError
from spark_state.format import datafile as snapshot, tables
from spark_state.format.manifest import CompactionRecord, Manifest
from spark_state.options import Settings
from spark_state.spark.files import read_query_id as query_id_of
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.layout import StoreRef, resolve_root
from tests.support.changes import KEYS, M, changes, checked_dict
from tests.support.stores import assert_files_of_kept_versions_exist, store_on


#: A store as a freshly started worker process sees it (nothing cached).
process = store_on


@pytest.fixture
def root(tmp_path):
    return f"file://{tmp_path}/store"


def test_commit_on_a_version_another_attempt_recommitted_is_refused(root):
    """Defect 1: executor A holds v2 while a retry on executor B re-commits v2; A must not build v3 on its view."""
    a, b = process(root), process(root)
    a.commit(1, changes({KEYS[0]: b"a"}))
    held = a.commit(2, changes({KEYS[1]: b"b"}), base_commit_id=None).commit_id
    b.commit(2, changes({KEYS[1]: b"B", KEYS[2]: b"c"}))          # the retried batch, other content
    with pytest.raises(StaleState, match="re-committed"):
        a.commit(3, changes({KEYS[3]: b"d"}), base_commit_id=held)
    fresh = a.load_checked(2, held)                               # what the shim does on getStore
    assert fresh.table is not None and fresh.commit_id != held
    a.commit(3, changes({KEYS[3]: b"d"}), base_commit_id=fresh.commit_id)
    assert checked_dict(b.load(3)) == {KEYS[0]: b"a", KEYS[1]: b"B", KEYS[2]: b"c", KEYS[3]: b"d"}
    assert a.load_checked(3, b.load_checked(3).commit_id).table is None, "an unchanged version is not re-sent"


def test_retention_never_deletes_another_process_in_flight_files(root):
    """Defect 2: a commit or compaction in flight elsewhere writes files no manifest names yet."""
    a, b = process(root), process(root)
    for v in range(1, 7):
        a.commit(v, changes({KEYS[v]: b"%d" % v}))
    in_flight = [b.storage.new_file_path(7, "delta"), b.storage.new_file_path(6, "snapshot")]
    for path in in_flight:
        b.storage.write_file(path, b"being written by process b")
    a.maintenance(2)          # grace 0: only the version rule protects them
    a.abort(7)                # not a's file
    assert set(in_flight) <= set(a.storage.list_files())
    assert_files_of_kept_versions_exist(a)


def test_compaction_elsewhere_never_pulls_files_from_under_a_commit(root):
    """A commit that read its base chain keeps it even if another process compacts and cleans meanwhile."""
    a, b = process(root), process(root, snapshot_interval=2)
    for v in range(1, 5):
        a.commit(v, changes({KEYS[v]: b"%d" % v}))
    base_chain = Manifest.from_json(a.storage.read_manifest(4), "4").paths
    b.maintenance(1, version=4)                                    # compacts 4, retains 3-4
    assert CompactionRecord.from_json(b.storage.read_record(4, "_snapshot"), "4")
    assert set(base_chain) <= set(a.storage.list_files()), "manifest 4 still names its chain"
    a.commit(5, changes({KEYS[5]: b"5"}))
    b.commit(6, changes({}))
    b.maintenance(1, version=6)
    assert_files_of_kept_versions_exist(b)
    assert checked_dict(a.load(6)) == {KEYS[v]: b"%d" % v for v in range(1, 6)}


def test_a_compaction_shortcut_never_names_a_snapshot_retention_elsewhere_dropped(root):
    """Process a compacts version 3 and, with no grace period, must not let a later commit of its own build on
    that snapshot: process b's retention around a newer version (window 4-7) drops record 3 and deletes the
    snapshot, so a re-commit of version 5 on base 4 would name a missing file (found by the model test)."""
    a, b = process(root, snapshot_interval=2), process(root, snapshot_interval=2)
    for v in range(1, 5):
        a.commit(v, changes({KEYS[v]: b"%d" % v}))        # manifest 4 names the chain v1 snapshot + deltas 2-4
    a.maintenance(4, version=3)                            # compacts version 3: a record, a snapshot of v3
    assert a.reader.view(3).record is not None
    for v in range(5, 8):
        b.commit(v, changes({KEYS[v]: b"%d" % v}))
    b.maintenance(4, version=7)                            # window 4-7: record 3 dropped, its snapshot deleted
    assert a.reader.view(4).record is None
    a.commit(5, changes({KEYS[5]: b"again"}), min_versions_to_retain=4)   # a retried batch on base 4
    assert_files_of_kept_versions_exist(a)
    assert checked_dict(b.load(5)) == {KEYS[1]: b"1", KEYS[2]: b"2", KEYS[3]: b"3", KEYS[4]: b"4",
                                       KEYS[5]: b"again"}


def test_grace_period_keeps_orphans_until_seen_long_enough(root, caplog):
    a = process(root, file_grace_period=3600)
    for v in range(1, 6):
        a.commit(v, changes({KEYS[v]: b"%d" % v}))
    orphan = a.storage.new_file_path(1, "delta")
    a.storage.write_file(orphan, b"left by a crashed commit")
    with caplog.at_level(logging.INFO, logger="spark_state.chain.retention"):
        a.maintenance(2)
        a.maintenance(2)
    assert orphan in a.storage.list_files(), "deleted before the grace period passed"
    # the log says when a file's grace period starts (once), so a file that outlives it can be traced
    started = [r.getMessage() for r in caplog.records if orphan in r.getMessage()]
    assert len(started) == 1 and "unreferenced; deleted once unreferenced for 3600s" in started[0], started
    a.settings = Settings(max_parallelism=M, file_grace_period=0)
    a.maintenance(2)
    assert orphan not in a.storage.list_files()


def test_versions_above_the_holder_are_kept(root):
    """An old executor (holding v3) runs maintenance while the live timeline is at v8: it drops nothing new."""
    live = process(root)
    for v in range(1, 9):
        live.commit(v, changes({KEYS[v % len(KEYS)]: b"%d" % v}))
    old = process(root)
    old.maintenance(2, version=3)
    assert old.versions() == [2, 3, 4, 5, 6, 7, 8]
    assert_files_of_kept_versions_exist(old)


def test_a_new_timeline_never_mixes_with_an_old_one(tmp_path):
    """Defect 3: checkpoint deleted and the query started again at the same path (new query id)."""
    settings = Settings(max_parallelism=M, checkpoint_root=f"file://{tmp_path}/shared-root", file_grace_period=0)

    def ref(query_id):
        return StoreRef(spark_root=f"file:{tmp_path}/ckpt/state", location=f"file:{tmp_path}/ckpt/state/0/0",
                        operator=0, partition=0, query_id=query_id)

    assert resolve_root(ref("run-1"), settings) != resolve_root(ref("run-2"), settings)
    forget_stores()
    old = open_store(ref("run-1"), settings)
    for v in range(1, 21):
        old.commit(v, changes({KEYS[0]: b"old %d" % v}))
    new = open_store(ref("run-2"), settings)
    assert new is not old and new.versions() == []
    new.commit(1, changes({KEYS[1]: b"new"}))
    new.commit(2, changes({}))
    new.maintenance(2)
    old.maintenance(2)
    assert checked_dict(new.load(2)) == {KEYS[1]: b"new"}
    assert checked_dict(old.load(20)) == {KEYS[0]: b"old 20"}


@pytest.mark.parametrize("new_versions", [2, 7], ids=["below-the-holder", "past-the-holder"])
def test_a_stopped_querys_maintenance_never_drops_the_new_timelines_versions(root, new_versions):
    """Defect 3 on a cluster: Spark runs maintenance on an unloaded query's provider once more after it
    stopped. Its checkpoint was deleted and the query started again at the same path: the old provider's
    window (around its v5) must not drop the new timeline's versions or files."""
    import shutil

    old = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M, file_grace_period=0),
                         query_id="run-1")
    for v in range(1, 6):
        old.commit(v, changes({KEYS[0]: b"old %d" % v}))
    shutil.rmtree(root.removeprefix("file://"))
    new = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M, file_grace_period=0),
                         query_id="run-2")
    for v in range(1, new_versions + 1):
        new.commit(v, changes({KEYS[v % len(KEYS)]: b"new %d" % v}))
    old.maintenance(2, version=5)
    assert new.versions() == list(range(1, new_versions + 1))
    assert_files_of_kept_versions_exist(new)
    assert checked_dict(new.load(1)) == {KEYS[1]: b"new 1"}


def test_commit_refuses_another_querys_version(root):
    first = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M), query_id="q-1")
    first.commit(1, changes({KEYS[0]: b"a"}))
    second = VersionedStore(FileSystemCheckpointStorage(root), Settings(max_parallelism=M), query_id="q-2")
    with pytest.raises(StorageError, match="belongs to query q-1.*own checkpointLocation"):
        second.commit(2, changes({KEYS[1]: b"b"}))
    assert first.versions() == [1]


def test_query_id_comes_from_the_checkpoint_metadata(tmp_path):
    (tmp_path / "ckpt" / "state").mkdir(parents=True)
    assert query_id_of(f"file:{tmp_path}/ckpt/state") is None
    (tmp_path / "ckpt" / "metadata").write_text(json.dumps({"id": "5f1d-query"}) + "\n")
    assert query_id_of(f"file:{tmp_path}/ckpt/state") == "5f1d-query"
    assert query_id_of(f"file:{tmp_path}/elsewhere") is None


def test_retention_runs_when_compaction_fails_and_failures_are_reported(root):
    """Defect 4: a failing compaction used to stop retention for good, with nothing but a log line."""
    a = process(root, snapshot_interval=3)
    for v in range(1, 7):
        a.commit(v, changes({KEYS[v]: b"%d" % v}))
    chain = Manifest.from_json(a.storage.read_manifest(6), "6").paths
    first = a.storage.list_files()[0]
    assert first in chain
    with open(a.storage._full(chain[-1]), "r+b") as f:     # bit rot in the newest delta: compaction cannot read it
        f.write(b"XXXX")
    a.maintenance(2, version=6)
    assert a.maintenance_failures == 1 and "ChecksumMismatch" in a.maintenance_error
    assert a.versions() == [5, 6], "retention ran although compaction failed"
    a.maintenance(2, version=6)
    assert a.maintenance_failures == 2
    a.commit(6, changes({KEYS[6]: b"6"}))     # the batch is re-committed: the bad file is no longer named
    a.maintenance(2, version=6)
    assert (a.maintenance_failures, a.maintenance_error) == (0, None)


def test_merge_and_encode_go_past_32_bit_offsets():
    """Defect 4 (2 GiB): merging works on 64-bit offsets and files are written in 32-bit batches."""
    base = changes({KEYS[0]: b"a", KEYS[1]: b"b"})
    wide = tables.widen(changes({KEYS[1]: None, KEYS[2]: b"c"}))
    merged = merge_chain([tables.widen(base), wide])
    assert merged.schema == tables.CHANGES_SCHEMA, "narrowed back where it fits"
    assert checked_dict(merged) == {KEYS[0]: b"a", KEYS[2]: b"c"}
    encoded = snapshot.encode(tables.widen(merged))
    assert checked_dict(snapshot.decode(encoded.data, "wide")) == {KEYS[0]: b"a", KEYS[2]: b"c"}


@pytest.mark.slow
def test_a_partition_over_2_gib_compacts(tmp_path):
    """The real thing: > 2 GiB of values in one chain (needs ~10 GiB of memory, ~1 min)."""
    store = process(f"file://{tmp_path}/big", snapshot_interval=1, compression_level=1, fsync=False)
    value = b"x" * (1 << 20)
    keys = [b"big-%06d" % i for i in range(2300)]
    hashes = [hash(k) & 0x7FFFFFFF for k in keys]
    for v, part in enumerate((keys[:1200], keys[1200:]), start=1):
        idx = [keys.index(k) for k in part]
        table = pa.table({"kg": pa.array([hashes[i] % M for i in idx], pa.int32()),
                          "hash": pa.array([hashes[i] for i in idx], pa.int32()),
                          "key": pa.array(part, pa.binary()),
                          "value": pa.array([value] * len(part), pa.binary())})
        store.commit(v, table)
    store.maintenance(2, version=2)
    assert store.maintenance_failures == 0, store.maintenance_error
    assert store.load(2).num_rows == len(keys)


def test_atomic_records_on_a_filesystem_without_atomic_put(tmp_path):
    """Defect 5: hdfs/webhdfs/sftp-like filesystems get temp-file-then-rename (here fsspec's dir:: wrapper)."""
    storage = FileSystemCheckpointStorage(f"dir::file://{tmp_path}/d")
    assert not storage._local and not storage._object_store
    storage.commit_manifest(1, b"first")
    storage.commit_manifest(1, b"second")          # replaces: rename over, or remove-then-rename
    assert storage.read_manifest(1) == b"second"
    names = storage.fs.ls(storage._full("chk-1"), detail=False)
    assert [n.rsplit("/", 1)[-1] for n in names] == ["_metadata"], "no temporary file is left behind"


def test_a_rename_that_reports_an_error_but_happened_is_not_undone(tmp_path, monkeypatch):
    """On an HDFS-like filesystem a rename whose reply is lost has still happened: removing `final` and
    renaming again (the replace-by-remove path) would delete the record just written."""
    storage = FileSystemCheckpointStorage(f"dir::file://{tmp_path}/d")
    storage.commit_manifest(1, b"first")
    mv = storage.fs.mv

    def mv_then_lose_the_reply(src, dst, **kw):
        mv(src, dst, **kw)
        raise OSError(110, "Connection timed out")

    monkeypatch.setattr(storage.fs, "mv", mv_then_lose_the_reply)
    storage.commit_manifest(1, b"second")
    monkeypatch.setattr(storage.fs, "mv", mv)
    assert storage.read_manifest(1) == b"second"


def test_fsync_is_on_for_local_disks_by_default(root, tmp_path):
    assert FileSystemCheckpointStorage(root).fsync
    assert not FileSystemCheckpointStorage(root, fsync=False).fsync
    assert not FileSystemCheckpointStorage(f"memory://x{os.getpid()}/s").fsync


def test_a_deleted_directory_is_made_again(root):
    """Same application, checkpoint deleted: cached 'directory exists' knowledge must not fail commits."""
    a = process(root)
    a.commit(1, changes({KEYS[0]: b"a"}))
    import shutil
    shutil.rmtree(a.storage._base)
    a.commit(1, changes({KEYS[0]: b"again"}))
    assert checked_dict(a.load(1)) == {KEYS[0]: b"again"}


def test_state_files_keep_the_process_umask(root, tmp_path):
    """Defect 6: files must stay readable by Spark's readers running as other users (umask 022 -> 0644)."""
    old = os.umask(0o022)
    try:
        a = process(root)
        a.commit(1, changes({KEYS[0]: b"a"}))
    finally:
        os.umask(old)
    path = a.storage._full(a.storage.list_files()[0])
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o044 == 0o044


def test_changes_schema_errors_stay_protocol_errors(root):
    with pytest.raises(ProtocolError):
        process(root).commit(1, pa.table({"x": [1]}))


def test_idle_stores_are_evicted_from_a_long_lived_worker(tmp_path, monkeypatch):
    """Defect 6: a worker serving query after query must not keep every store object forever."""
    import spark_state.chain.registry as state

    forget_stores()
    settings = Settings(max_parallelism=M)

    def ref(n):
        return StoreRef(spark_root=f"file:{tmp_path}/q{n}/state", location=f"file:{tmp_path}/q{n}/state/0/0",
                        operator=0, partition=0, query_id=f"q{n}")

    first = open_store(ref(1), settings)
    first.commit(1, changes({KEYS[0]: b"a"}))
    monkeypatch.setattr(state, "STORE_IDLE_SECONDS", 0.0)
    open_store(ref(2), settings)
    assert len(state._STORES) == 1, "the idle store of query 1 was kept"
    again = open_store(ref(1), settings)
    assert again is not first and checked_dict(again.load(1)) == {KEYS[0]: b"a"}, "eviction lost nothing"
    forget_stores()


def test_a_process_reads_what_another_process_wrote_after_its_listing_on_s3():
    """Found by the model test: a worker's maintenance lists shared/ (fsspec caches the listing in the
    worker's filesystem object, forever), another executor then commits a version, and a load of that
    version in the first worker failed with "state file ... is missing": s3fs looked the new delta up in
    the cached listing instead of asking S3. Storage is the only truth between processes."""
    import uuid

    from tests.support import s3_server

    s3_server.start()
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(bucket)
    root = f"s3://{bucket}/store"
    settings = Settings(max_parallelism=M, snapshot_interval=2, file_grace_period=0)
    a = VersionedStore(FileSystemCheckpointStorage(root), settings)   # a worker: fsspec's shared instance
    b = VersionedStore(FileSystemCheckpointStorage(root, skip_instance_cache=True), settings)   # another process
    first = a.commit(1, changes({KEYS[0]: b"a"})).commit_id
    a.maintenance(2, version=1)                                     # lists shared/
    second = b.commit(2, changes({KEYS[1]: b"b"}), base_commit_id=first).commit_id
    loaded = a.load_checked(2)
    assert loaded.commit_id == second and checked_dict(loaded.table) == {KEYS[0]: b"a", KEYS[1]: b"b"}
    b.commit(3, changes({KEYS[2]: b"c"}), base_commit_id=second)
    b.maintenance(2, version=3)                                     # compacts 3: a record a has never listed
    a.maintenance(2, version=3)
    assert checked_dict(a.load(3)) == {KEYS[0]: b"a", KEYS[1]: b"b", KEYS[2]: b"c"}
    assert_files_of_kept_versions_exist(a)
