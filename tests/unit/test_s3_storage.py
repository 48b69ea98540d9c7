"""FileSystemCheckpointStorage against a real S3 endpoint (moto server on 127.0.0.1)."""

from __future__ import annotations

import threading
import uuid

import fsspec
import fsspec.config
import pyarrow as pa
import pytest

from spark_state.chain import forget_stores, open_store
from spark_state.errors import ChecksumMismatch, VersionNotFound
from spark_state.options import Settings
from spark_state.storage import instances
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.layout import StoreRef
from spark_state.worker.warmup import warm_storage
from tests.support import s3_server
from tests.support.changes import as_dict, changes_table


@pytest.fixture(scope="module")
def bucket():
    s3_server.start()
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(name)
    return name


def _changes(puts: dict[int, bytes | None]) -> pa.Table:
    """Changes of the keys ``k.to_bytes(4)``, each hashed to ``k`` (the default max parallelism)."""
    keys = sorted(puts)
    return changes_table(keys, [k.to_bytes(4, "big") for k in keys], [puts[k] for k in keys])


def _store(bucket: str, snapshot_interval: int = 2):
    ref = StoreRef(spark_root="file:/tmp/q/state", location="file:/tmp/q/state/0/0", operator=0, partition=0)
    settings = Settings(checkpoint_root=f"s3://{bucket}/state", snapshot_interval=snapshot_interval)
    return open_store(ref, settings)


def test_versions_compaction_and_retention_on_s3(bucket):
    store = _store(bucket)
    model: dict[bytes, bytes] = {}
    for version in range(1, 8):
        puts = {k: f"v{version}-{k}".encode() for k in range(version, version + 20)}
        puts[version - 1] = None  # one delete per version
        store.commit(version, _changes(puts))
        for k, v in puts.items():
            if v is None:
                model.pop(k.to_bytes(4, "big"), None)
            else:
                model[k.to_bytes(4, "big")] = v
        store.maintenance(min_versions_to_retain=3)
    assert as_dict(store.load(7)) == model
    assert store.versions()[-3:] == [5, 6, 7]
    with pytest.raises(VersionNotFound):
        store.load(1)  # retained away
    forget_stores()  # a new process: nothing cached, everything from S3
    assert as_dict(_store(bucket).load(7)) == model
    fs = fsspec.filesystem("s3")
    assert fs.ls(f"{bucket}/state"), "files must be on the S3 endpoint"


def test_corrupted_object_on_s3_is_named(bucket):
    store = _store(bucket)
    forget_stores()
    store = _store(bucket)
    latest = store.latest_version()
    fs = fsspec.filesystem("s3")
    files = [p for p in fs.find(f"{bucket}/state") if p.endswith(".arrow")]
    victim = max(files)
    data = bytearray(fs.cat_file(victim))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(victim, bytes(data))
    forget_stores()
    with pytest.raises(ChecksumMismatch) as err:
        _store(bucket).load(latest)
    assert victim.rsplit("/", 1)[-1] in str(err.value)


def test_stores_opened_on_other_threads_use_the_client_the_warm_up_made(bucket):
    """The worker answers each JVM connection on a thread of its own; where fsspec cached filesystems per thread
    (before 2026.5), a store first opened on a new thread made a new S3 client (an HTTP session, an SSL context,
    its own connections) inside its restore, while the storage warm-up's client went unused."""
    root = f"s3://{bucket}/state"
    warmed = {}

    def warm():
        assert warm_storage(root)
        warmed["fs"] = FileSystemCheckpointStorage(root).fs
        warmed["client"] = warmed["fs"]._s3

    thread = threading.Thread(target=warm)
    thread.start()
    thread.join()
    assert warmed["client"] is not None, "the warm-up made no client"
    forget_stores()
    store = _store(bucket)   # on this thread, at the store's own root beneath the checkpoint root
    store.commit((store.latest_version() or 0) + 1, _changes({1: b"one"}))
    assert store.ctx.storage.fs is warmed["fs"]
    assert store.ctx.storage.fs._s3 is warmed["client"]


def test_a_shared_s3_client_keeps_room_for_an_executors_requests_and_the_users_own_pool_size(bucket):
    root = f"s3://{bucket}/state"
    default = FileSystemCheckpointStorage(root).fs
    assert default.storage_options["config_kwargs"]["max_pool_connections"] == instances.S3_POOL_CONNECTIONS
    own = FileSystemCheckpointStorage(root, config_kwargs={"max_pool_connections": 5}).fs
    assert own.storage_options["config_kwargs"] == {"max_pool_connections": 5}
    assert own is not default, "other options are another client"


def test_two_s3_filesystems_of_the_same_options_become_one_and_other_options_stay_apart():
    """What fsspec before 2026.5 did per thread (two instances of equal options), ``shared`` makes one."""
    import s3fs

    first = s3fs.S3FileSystem(skip_instance_cache=True, anon=False, config_kwargs={"connect_timeout": 3})
    second = s3fs.S3FileSystem(skip_instance_cache=True, anon=False, config_kwargs={"connect_timeout": 3})
    other = s3fs.S3FileSystem(skip_instance_cache=True, anon=False, config_kwargs={"connect_timeout": 4})
    assert first is not second
    assert instances.shared(first) is first
    assert instances.shared(second) is first
    assert instances.shared(other) is other
    bound = s3fs.S3FileSystem(skip_instance_cache=True, asynchronous=True, anon=False,
                              config_kwargs={"connect_timeout": 3})
    assert instances.shared(bound) is bound, "an instance on a loop of its own is never shared"


def test_only_async_filesystems_used_synchronously_are_shared(tmp_path):
    local = fsspec.filesystem("file")
    assert instances.shared(local) is local
    memory = fsspec.filesystem("memory")
    assert instances.shared(memory) is memory
    assert instances.with_pool("file", {"auto_mkdir": True}) == {"auto_mkdir": True}


def test_the_pool_size_keeps_the_s3_client_settings_fsspecs_configuration_gives(bucket, monkeypatch):
    """Users set s3fs up through fsspec's configuration (its config files, ``FSSPEC_S3_*``): the pool size joins
    those client settings rather than replacing them."""
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"connect_timeout": 7}})
    fs = FileSystemCheckpointStorage(f"s3://{bucket}/state").fs
    assert fs.storage_options["config_kwargs"] == {"connect_timeout": 7,
                                                   "max_pool_connections": instances.S3_POOL_CONNECTIONS}


def test_a_client_configuration_that_is_not_a_mapping_is_left_to_s3fs():
    """An INI config file gives its values as text: the pool size is not merged into it (s3fs reports it)."""
    assert instances.with_pool("s3", {"config_kwargs": "retries=3"}) == {"config_kwargs": "retries=3"}


def test_the_tools_see_a_file_written_after_they_listed_its_folder(bucket):
    """A driver that ran one tool (listing a store's folder: a rescale) and later another (a savepoint copying a
    snapshot a compaction wrote meanwhile): s3fs's listings cache made the new file missing for the process's
    life. Found by the soak: a savepoint of a query just rescaled failed three times on a snapshot it could see."""
    from spark_state.storage.directory import Dir

    root = f"s3://{bucket}/tools-{uuid.uuid4().hex[:8]}"
    tools = Dir(root)
    tools.write("shared/a.arrow", b"a")
    assert tools.listdir("shared") == ["a.arrow"]
    fsspec.filesystem("s3", skip_instance_cache=True).pipe_file(f"{root.removeprefix('s3://')}/shared/b.arrow", b"bb")
    again = Dir(root)   # the next tool of the same process
    assert again.read("shared/b.arrow") == b"bb"
    assert again.size("shared/b.arrow") == 2 and sorted(again.listdir("shared")) == ["a.arrow", "b.arrow"]
