"""Checkpoint storages: layout, atomic manifests, listing, deletion, URL resolution, memory limits."""

import os

import pytest

from spark_state.errors import StateLost, StateTooLarge, StorageError, StoreDeleted, VersionNotFound
from spark_state.options import OptionError, Settings
from spark_state.storage import storage_for
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.layout import StoreRef, file_version, format_versions, resolve_root
from spark_state.storage.memory import MemoryCheckpointStorage, clear_registry
from spark_state.storage.urls import normalize_url


@pytest.fixture(params=["file", "memory-fs", "memory"])
def storage(request, tmp_path):
    if request.param == "file":
        yield FileSystemCheckpointStorage(f"file://{tmp_path}/store")
    elif request.param == "memory-fs":
        root = f"memory://{tmp_path.name}/store"
        yield FileSystemCheckpointStorage(root)
        FileSystemCheckpointStorage(root).fs.rm(f"/{tmp_path.name}", recursive=True)
    else:
        root = f"file://{tmp_path}/mem"
        yield MemoryCheckpointStorage(root, max_state_size=1 << 20)
        clear_registry(root)


def test_write_read_ranges_and_listing(storage):
    path = storage.new_file_path(3, "delta")
    assert file_version(path) == 3 and path.startswith("shared/")
    storage.write_file(path, b"0123456789")
    assert storage.read_file(path) == b"0123456789"
    assert [bytes(b) for b in storage.read_ranges(path, [(0, 2), (5, 9)])] == [b"01", b"5678"]
    # past the end: what the file has, as a local read gives it (a row image's reader calls that damage)
    assert [bytes(b) for b in storage.read_ranges(path, [(8, 12), (20, 30), (1, 3)])] == [b"89", b"", b"12"]
    assert storage.list_files() == [path]
    assert storage.list_versions() == []          # data without a manifest is not a version
    with pytest.raises(VersionNotFound, match="versions present: none"):
        storage.read_manifest(3)
    storage.commit_manifest(3, b"m3")
    storage.commit_manifest(4, b"m4")
    assert storage.list_versions() == [3, 4]
    assert storage.read_manifest(3) == b"m3"
    stamp = storage.list_manifests()[3]
    storage.commit_manifest(3, b"m3-replaced")    # re-commit replaces
    assert storage.read_manifest(3) == b"m3-replaced"
    assert storage.list_manifests()[3] != stamp
    storage.delete_version(3)
    assert storage.list_versions() == [4]
    with pytest.raises(VersionNotFound, match="versions present: 4"):
        storage.read_manifest(3)
    storage.delete_files([path, "shared/nope"])
    assert storage.list_files() == []


def test_local_layout_and_atomic_manifest(tmp_path):
    st = FileSystemCheckpointStorage(f"file:{tmp_path}/s")   # Hadoop style, one slash, is accepted too
    st.write_file(st.new_file_path(1, "snapshot"), b"x")
    st.commit_manifest(1, b"one")
    st.commit_manifest(1, b"two")
    root = tmp_path / "s"
    assert sorted(os.listdir(root)) == ["chk-1", "shared"]          # no taskowned/, no junk
    assert os.listdir(root / "chk-1") == ["_metadata"]             # no temp files left behind
    assert (root / "chk-1" / "_metadata").read_bytes() == b"two"


def test_background_writes_never_bring_a_deleted_store_back(tmp_path):
    """recreate=False (compaction): a store root that is gone stays gone, a directory seen before and gone
    since is deleted, and only a store that never had shared/ gets it (without parents); commits re-create."""
    import shutil

    root = tmp_path / "ckpt" / "s"
    fresh = FileSystemCheckpointStorage(f"file://{root}")
    with pytest.raises(StoreDeleted, match="was deleted"):
        fresh.write_file(fresh.new_file_path(1, "snapshot"), b"x", recreate=False)
    assert not (tmp_path / "ckpt").exists()
    root.mkdir(parents=True)
    fresh.write_file(fresh.new_file_path(1, "snapshot"), b"x", recreate=False)   # never had shared/: made
    assert sorted(os.listdir(root)) == ["shared"]

    st = FileSystemCheckpointStorage(f"file://{root}")
    st.write_file(st.new_file_path(2, "delta"), b"y")
    st.commit_manifest(2, b"m")
    shutil.rmtree(root / "shared")
    with pytest.raises(StoreDeleted):
        st.write_file(st.new_file_path(2, "snapshot"), b"z", recreate=False)
    shutil.rmtree(root / "chk-2")
    with pytest.raises(StoreDeleted):
        st.commit_compaction(2, b"record")
    assert os.listdir(root) == []
    st.write_file(st.new_file_path(1, "snapshot"), b"new timeline")              # a commit re-creates
    st.commit_manifest(1, b"m1")
    assert sorted(os.listdir(root)) == ["chk-1", "shared"]

    # Another process (a restarted worker) that only compacts: a directory it wrote into counts as seen.
    other = FileSystemCheckpointStorage(f"file://{root}")
    other.write_file(other.new_file_path(1, "snapshot"), b"compacted", recreate=False)
    shutil.rmtree(root / "shared")
    with pytest.raises(StoreDeleted):
        other.write_file(other.new_file_path(1, "snapshot"), b"again", recreate=False)
    assert sorted(os.listdir(root)) == ["chk-1"]


def test_missing_data_file_is_a_clear_error(tmp_path):
    st = FileSystemCheckpointStorage(f"file://{tmp_path}/s")
    with pytest.raises(StorageError, match="is missing"):
        st.read_file("shared/v0000000001-delta-00.arrow")


def test_normalize_url():
    assert normalize_url("file:/tmp/q/state/0/3") == "file:///tmp/q/state/0/3"
    assert normalize_url("file:///tmp/q") == "file:///tmp/q"
    assert normalize_url("file://localhost/tmp/q") == "file:///tmp/q"
    assert normalize_url("/tmp/q/") == "file:///tmp/q/"
    assert normalize_url("s3://bucket/a/b/") == "s3://bucket/a/b"
    assert normalize_url("memory://x/y") == "memory://x/y"
    for bad in ["relative/path", "", "s3:bucket", "file:relative", "file://otherhost/x", "C:\\x"]:
        with pytest.raises(StorageError):
            normalize_url(bad)


def test_resolve_root():
    ref = StoreRef("file:/tmp/q/state", "file:/tmp/q/state/0/3", 0, 3)
    assert resolve_root(ref, Settings()) == "file:///tmp/q/state/0/3"
    other = StoreRef("file:/tmp/other/state", "file:/tmp/other/state/0/3", 0, 3)
    a = resolve_root(ref, Settings(checkpoint_root="/data/ckpt"))
    b = resolve_root(other, Settings(checkpoint_root="/data/ckpt"))
    assert a.startswith("file:///data/ckpt/") and a.endswith("/0/3/default")
    assert a != b, "two queries must never share a directory"
    join = StoreRef("file:/tmp/q/state", "file:/tmp/q/state/0/3/left-keyToNumValues", 0, 3, "left-keyToNumValues")
    assert resolve_root(join, Settings()) == "file:///tmp/q/state/0/3/left-keyToNumValues"


def test_storage_for_errors(tmp_path):
    ref = StoreRef(f"file:{tmp_path}", f"file:{tmp_path}/0/0", 0, 0)
    assert isinstance(storage_for(ref, Settings()), FileSystemCheckpointStorage)
    assert isinstance(storage_for(ref, Settings(storage="memory")), MemoryCheckpointStorage)
    with pytest.raises(OptionError, match="storage='rocksdb' is not known"):
        storage_for(ref, Settings(storage="rocksdb"))
    with pytest.raises(OptionError):
        Settings.from_conf({"storage": "tape"})
    with pytest.raises(StorageError, match="neither a URL nor an absolute path"):
        storage_for(StoreRef("x", "relative/0/0", 0, 0), Settings())
    with pytest.raises(StorageError, match="cannot use checkpoint storage URL"):
        storage_for(StoreRef("x", "nosuchproto://b/0/0", 0, 0), Settings())


def test_memory_limit_message_names_size_limit_and_fix():
    st = MemoryCheckpointStorage("memory-limit-test", max_state_size=1000)
    with pytest.raises(StateTooLarge) as info:
        st.write_file(st.new_file_path(7, "delta"), b"x" * 5000)
    msg = str(info.value)
    assert "5000 bytes" in msg and "1000 bytes" in msg
    assert "spark.sql.streaming.stateStore.sparkState.memory.maxStateSize" in msg
    assert "storage=filesystem" in msg
    assert st.list_files() == []
    clear_registry("memory-limit-test")


def test_memory_registry_is_shared_and_lost_with_the_process(tmp_path):
    root = "registry-test-root"
    meta = f"file://{tmp_path}/meta"
    a = MemoryCheckpointStorage(root, 1 << 20, meta)
    a.write_file("shared/v0000000001-snapshot-aa.arrow", b"data")
    a.commit_manifest(1, b"manifest")
    b = MemoryCheckpointStorage(root, 1 << 20, meta)
    assert b.read_manifest(1) == b"manifest"      # same root, same process: same files
    clear_registry(root)                           # a new worker process
    c = MemoryCheckpointStorage(root, 1 << 20, meta)
    assert c.list_versions() == [1]               # the durable manifest still says version 1 exists
    with pytest.raises(StateLost, match="has ended") as info:
        c.read_manifest(1)
    assert "storage=filesystem" in str(info.value)
    with pytest.raises(VersionNotFound):
        c.read_manifest(2)
    with pytest.raises(StateLost):
        c.read_file("shared/v0000000001-snapshot-aa.arrow")


def test_format_versions():
    assert format_versions([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"
    assert format_versions([]) == "none"


def test_listing_versions_on_s3_is_one_request_not_one_per_version():
    """Found by the soak (benchmarks/soak): on S3 ``glob("chk-*/_metadata")`` lists every ``chk-N/`` on its own,
    so every retention run and every tool paid a request per retained version (24 versions: 10 s through
    the soak's proxy). One listing of the keys under ``chk-`` finds the same records."""
    import uuid

    from tests.support import s3_server

    s3_server.start()
    bucket = f"list-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(bucket)
    storage = FileSystemCheckpointStorage(f"s3://{bucket}/store")
    for version in range(1, 13):
        storage.write_file(storage.new_file_path(version, "delta"), b"data")
        storage.commit_manifest(version, f"m{version}".encode())
        if version % 4 == 0:
            storage.commit_record(version, "_snapshot", b"record")
    storage.write_file("chk-13/_metadata.tmp-abc", b"a temporary name is no record")
    lists = []
    storage.fs.s3.meta.events.register("before-call.s3.ListObjectsV2", lambda **kw: lists.append(kw))
    assert storage.list_versions() == list(range(1, 13))
    assert len(lists) == 1, f"{len(lists)} listings for 12 versions"
    assert sorted(storage.list_records("_snapshot")) == [4, 8, 12]
    assert storage.read_manifest(7) == b"m7"


def test_a_range_past_the_end_that_the_backend_refuses_reads_what_the_file_has_and_other_errors_stay(tmp_path,
                                                                                                     monkeypatch):
    """An object store refuses a range that starts past an object's end (S3: 416, which s3fs raises as OSError)
    where a local read gives fewer bytes: read_ranges answers it as the local read does, so that a truncated row
    image reads as damage. An error on a file that holds every range asked (a timeout) is the storage's, raised."""
    import errno

    root = f"memory://{tmp_path.name}/refusing"
    storage = FileSystemCheckpointStorage(root)
    path = storage.new_file_path(1, "delta")
    storage.write_file(path, b"0123456789")
    fs, original = storage.fs, storage.fs.cat_file
    failures = []

    def refusing(full, start=None, end=None, **kw):   # S3's answer to a range past the end
        if start is not None and start >= fs.size(full):
            raise OSError(errno.EINVAL, "The requested range is not satisfiable")
        if failures:
            raise failures.pop()
        return original(full, start=start, end=end, **kw)

    monkeypatch.setattr(fs, "cat_file", refusing)
    monkeypatch.setattr(fs, "cat_ranges", lambda paths, starts, ends, **kw: [refusing(p, s, e) for p, s, e
                                                                             in zip(paths, starts, ends)])
    try:
        with pytest.raises(OSError):
            refusing(storage._full(path), 12, 20)
        assert [bytes(b) for b in storage.read_ranges(path, [(12, 20)])] == [b""]
        assert [bytes(b) for b in storage.read_ranges(path, [(20, 30), (8, 12), (0, 2)])] == [b"", b"89", b"01"]
        failures.append(TimeoutError(errno.ETIMEDOUT, "timed out"))
        with pytest.raises(TimeoutError):
            storage.read_ranges(path, [(0, 2), (5, 9)])   # the file holds both: not a short file
    finally:
        fs.rm(f"/{tmp_path.name}", recursive=True)
