"""MemoryCheckpointStorage: a store's files in the worker process's memory (Flink's JobManager storage).

For tests and small jobs: no I/O at all, and nothing survives the process.
Two guards keep that from losing state silently:

* every file is limited to ``memory_max_state_size`` bytes (a snapshot is the
  whole state): a bigger one fails with ``StateTooLarge`` naming the size, the
  limit and the fix, instead of letting executor memory grow unnoticed;
* with a metadata storage (``memory.metadataDir``), each manifest is also
  written there durably. A later process that finds a durable manifest but
  no data raises ``StateLost`` instead of restoring an empty state.

Files live in a module-level registry keyed by the store's root, so every
instance for the same root in this process sees the same files.
"""

from __future__ import annotations

import threading
import zlib
from typing import Iterable, Sequence

from spark_state.errors import StateLost, StateTooLarge, VersionNotFound
from spark_state.options import PREFIX
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.layout import (
    MANIFEST_NAME, SHARED_DIR, file_version, lineage_of, manifest_path, record_path, version_dir_of,
)

_REGISTRY: dict[str, dict[str, bytes]] = {}
_REGISTRY_LOCK = threading.Lock()


def clear_registry(root: str | None = None) -> None:
    """Forgets the files of one root (or all): what a new worker process would see."""
    with _REGISTRY_LOCK:
        if root is None:
            _REGISTRY.clear()
        else:
            _REGISTRY.pop(root, None)


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


class MemoryCheckpointStorage(CheckpointStorage):
    kind = "memory"

    def __init__(self, root: str, max_state_size: int, metadata: CheckpointStorage | str | None = None):
        """`metadata`: a durable storage (or its URL) that gets a copy of every manifest (``memory.metadataDir``)."""
        super().__init__(root)
        self.max_state_size = max_state_size
        if isinstance(metadata, str):
            from spark_state.storage import durable_storage   # the registry picks the backend

            metadata = durable_storage(metadata)
        self.metadata = metadata

    @property
    def _files(self) -> dict[str, bytes]:
        with _REGISTRY_LOCK:
            return _REGISTRY.setdefault(self.root, {})

    # ------------------------------------------------------------- writing

    def write_file(self, path: str, data: bytes, *, recreate: bool = True) -> None:
        if len(data) > self.max_state_size:
            version = file_version(path)
            raise StateTooLarge(
                f"memory storage: a state file of store {self.root} (version {version}) is {_mib(len(data))} "
                f"({len(data)} bytes), above the limit of {_mib(self.max_state_size)} ({self.max_state_size} bytes). "
                f"Raise {PREFIX}memory.maxStateSize (e.g. to {max(2 * len(data), 1 << 20) // (1 << 20)}m) or use "
                f"{PREFIX}storage=filesystem, which keeps state in files and has no such limit."
            )
        self._files[path] = bytes(data)

    def commit_record(self, version: int, name: str, data: bytes, *, recreate: bool = True) -> None:
        if self.metadata is not None and name == MANIFEST_NAME:
            self.metadata.commit_manifest(version, data)   # durable first: visible here => known there
        self._files[record_path(version, name)] = bytes(data)

    # ------------------------------------------------------------- reading

    def read_record(self, version: int, name: str) -> bytes | None:
        return self._files.get(record_path(version, name))

    def read_manifest(self, version: int) -> bytes:
        data = self._files.get(manifest_path(version))
        if data is not None:
            return data
        if self.metadata is not None:
            try:
                self.metadata.read_manifest(version)
            except VersionNotFound:
                pass
            else:
                raise StateLost(
                    f"version {version} of state store {self.root} was committed to memory storage by a worker "
                    f"process that has ended; its manifest is in {self.metadata.root} but its data lived only in "
                    f"that process's memory and is gone. Memory storage cannot survive a worker or executor "
                    f"restart: use {PREFIX}storage=filesystem for state that must survive, and restart this query "
                    f"from a new checkpointLocation."
                )
        raise self.version_not_found(version)

    def version_not_found(self, version: int) -> VersionNotFound | StateLost:
        """With nothing in memory for this store, a version Spark asks for was lost with an ended worker."""
        if version > 0 and not self.list_versions():
            return StateLost(
                f"version {version} of state store {self.root} is not in this worker's memory, which holds "
                f"no version of the store at all (versions present: none): memory storage keeps state only "
                f"in the worker process, and the worker that held it has ended (a new application, a restarted executor or a killed worker). "
                f"Use {PREFIX}storage=filesystem for state that must survive restarts (set "
                f"{PREFIX}memory.metadataDir to detect this case exactly), and restart this query from a new "
                f"checkpointLocation."
            )
        return super().version_not_found(version)

    def _data(self, path: str) -> bytes:
        data = self._files.get(path)
        if data is None:
            raise StateLost(
                f"state file {path} of store {self.root} is not in this process's memory storage; the process "
                f"that wrote it has ended or it was deleted. Use {PREFIX}storage=filesystem for durable state."
            )
        return data

    def read_file(self, path: str, size: int | None = None) -> bytes:
        return self._data(path)

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        view = memoryview(self._data(path))
        return [view[start:end] for start, end in ranges]

    def list_records(self, name: str = MANIFEST_NAME) -> dict[int, str]:
        out = {}
        if self.metadata is not None and name == MANIFEST_NAME:
            out.update({v: "durable:" + s for v, s in self.metadata.list_manifests().items()})
        for path, data in list(self._files.items()):
            head, _, tail = path.partition("/")
            version = version_dir_of(head)
            if version is not None and tail == name:
                out[version] = f"mem:{len(data)}:{zlib.crc32(data):08x}"
        return out

    def list_lineages(self) -> dict[tuple[int, str], str]:
        out = {}
        for path, data in list(self._files.items()):
            head, _, tail = path.partition("/")
            version, commit_id = version_dir_of(head), lineage_of(tail)
            if version is not None and commit_id is not None:
                out[(version, commit_id)] = f"mem:{len(data)}:{zlib.crc32(data):08x}"
        return out

    def list_files(self, prefix: str = SHARED_DIR) -> list[str]:
        prefix = prefix.strip("/") + "/"
        return sorted(p for p in list(self._files) if p.startswith(prefix))

    # ------------------------------------------------------------- deleting

    def delete_version(self, version: int) -> None:
        files = self._files
        files.pop(manifest_path(version), None)
        for path in [p for p in list(files) if p.startswith(f"chk-{version}/")]:
            files.pop(path, None)
        if self.metadata is not None:
            self.metadata.delete_version(version)

    def delete_files(self, paths: Iterable[str]) -> None:
        files = self._files
        for path in paths:
            files.pop(path, None)
