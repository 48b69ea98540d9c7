"""Checkpoint storages: the spec (``base``), its backends (``filesystem``, ``memory``), and the choice
between them (``storage_for``, like fsspec's registry). Naming and locations are ``layout`` and ``urls``;
``atomic`` and ``directory`` write files for the backends and the offline tools alike.

The backends are imported when a storage is made, so ``layout`` and ``urls`` cost no fsspec import.
"""

from __future__ import annotations

from spark_state.errors import OptionError
from spark_state.options import PREFIX, STORAGES, Settings
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.layout import StoreRef, metadata_root, resolve_root

__all__ = ["CheckpointStorage", "durable_storage", "storage_for"]


def durable_storage(url: str) -> CheckpointStorage:
    """A filesystem storage at `url` (memory storage's durable copy of its manifests)."""
    from spark_state.storage.filesystem import FileSystemCheckpointStorage

    return FileSystemCheckpointStorage(url)


def storage_for(ref: StoreRef, settings: Settings) -> CheckpointStorage:
    """The checkpoint storage settings.storage names, rooted where this store's files belong."""
    if settings.storage not in STORAGES:
        raise OptionError(f"{PREFIX}storage={settings.storage!r} is not known; use one of: {', '.join(STORAGES)}.")
    root = resolve_root(ref, settings)
    if settings.storage == "memory":
        from spark_state.storage.memory import MemoryCheckpointStorage

        metadata = metadata_root(ref, settings)
        return MemoryCheckpointStorage(root, settings.memory_max_state_size,
                                       durable_storage(metadata) if metadata else None)
    from spark_state.storage.filesystem import FileSystemCheckpointStorage

    return FileSystemCheckpointStorage(root, fsync=settings.fsync)
