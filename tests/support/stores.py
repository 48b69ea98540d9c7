"""spark_state stores for tests: one on a temporary root with small test settings, and the store of a
real query's checkpoint opened as the worker opens it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_state.chain import VersionedStore, forget_stores, open_store
from spark_state.format.manifest import CompactionRecord, Manifest
from spark_state.options import Settings
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.layout import StoreRef
from tests.support.changes import M


#: Settings of a test store: snapshots every 2 versions, so short chains compact; no grace period, so
#: retention deletes unreferenced files at once and tests can see that it did.
TEST_SETTINGS = dict(max_parallelism=M, snapshot_interval=2, file_grace_period=0)


def store_on(storage: str | Any, *, fsync: bool = True, **settings: Any) -> VersionedStore:
    """A fresh VersionedStore (nothing cached, as a newly started worker process sees it) on ``storage``:
    a URL (``file://...``, ``memory://...``) or a CheckpointStorage. ``settings`` override TEST_SETTINGS."""
    if isinstance(storage, str):
        storage = FileSystemCheckpointStorage(storage, fsync=fsync)
    return VersionedStore(storage, Settings(**{**TEST_SETTINGS, **settings}))


def store_root(checkpoint: Path, operator: int = 0, partition: int = 0, store_name: str = "default") -> Path:
    """Spark's state directory of one store: ``<ckpt>/state/<op>/<partition>[/<storeName>]``."""
    root = Path(checkpoint) / "state" / str(operator) / str(partition)
    return root if store_name == "default" else root / store_name


def open_stored(checkpoint: Path, operator: int = 0, partition: int = 0, store_name: str = "default",
                **options: Any) -> VersionedStore:
    """spark_state's VersionedStore of one store of a checkpoint, opened as the worker opens it.

    ``options`` are Settings fields (storage="filesystem" by default); the
    store root is Spark's state directory of the store.
    """
    forget_stores()  # always read the files, not a cached store
    ref = StoreRef(spark_root="file:" + str(Path(checkpoint) / "state"),
                   location="file:" + str(store_root(checkpoint, operator, partition, store_name)),
                   operator=operator, partition=partition, name=store_name)
    return open_store(ref, Settings(**options))


def assert_files_of_kept_versions_exist(store):
    """Every file a present manifest or compaction record names exists."""
    present = set(store.storage.list_files())
    for v in store.versions():
        manifest = Manifest.from_json(store.storage.read_manifest(v), str(v))
        missing = set(manifest.paths) - present
        assert not missing, f"version {v} references deleted files {missing}"
        record = store.storage.read_record(v, "_snapshot")
        if record is not None:
            snap = CompactionRecord.from_json(record, str(v)).snapshot.path
            assert snap in present, f"compaction record of version {v} names deleted file {snap}"
