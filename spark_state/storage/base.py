"""CheckpointStorage: where a store's versions live, independent of the file format.

One spec, many backends (Flink's ``CheckpointStorage``, fsspec's
``AbstractFileSystem``): the version chain (``spark_state.chain``) only ever
calls the methods below, with paths relative to the store's root. What the
paths are is ``spark_state.storage.layout``'s business (docs/format.md,
"Checkpoint layout").

Data is always written before the manifest that names it, and a manifest
names only complete files, so a crash between the two leaves an
unreferenced file for retention to collect, never a half-visible version.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Sequence

from spark_state.errors import VersionNotFound
from spark_state.storage import layout
from spark_state.storage.layout import COMPACTION_NAME, MANIFEST_NAME, SHARED_DIR, format_versions, lineage_name


class CheckpointStorage(ABC):
    """Files of one store (one operator, partition and store name), addressed relative to its root."""

    kind: str = "abstract"
    #: Whether a reader waits on a round trip per file (object stores, remote filesystems): then a chain's
    #: files are worth reading at once (``ChainReader.read_chain``).
    remote: bool = False

    def __init__(self, root: str):
        self.root = root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    # ------------------------------------------------------------- naming

    #: A fresh path in shared/ for a data file of `version` (the naming is layout's; every backend uses it).
    new_file_path = staticmethod(layout.new_file_path)

    def version_not_found(self, version: int) -> VersionNotFound:
        existing = self.list_versions()
        return VersionNotFound(
            f"version {version} of state store {self.root} ({self.kind} storage) does not exist; "
            f"versions present: {format_versions(existing)}. It was never committed, or retention "
            f"(spark.sql.streaming.minBatchesToRetain) already deleted it."
        )

    # ------------------------------------------------------------- writing

    def init_version(self, version: int) -> None:
        """Prepares the location of version N (chk-N/) where the backend needs directories."""

    @abstractmethod
    def write_file(self, path: str, data: bytes, *, recreate: bool = True) -> None:
        """Writes one complete data file; it is invisible until a manifest names it.

        ``recreate=False`` is for background work (compaction): where the store's directory was
        deleted (a stopped query's checkpoint removed by its user), raise StoreDeleted rather than
        bring the directory back, so a deleted checkpoint stays deleted. Object stores have no
        directories to bring back; there the caller's re-read of the manifest is the check.
        """

    def open_data_file(self, path: str, *, recreate: bool = True) -> "DataFileWriter":
        """A data file written in pieces as they come (a commit streamed while its batch runs, a compaction a
        key-group range at a time); like write_file, invisible until a manifest names it (``recreate``: as
        write_file). This default keeps the pieces in memory and writes the file whole at ``close``; backends
        that can append (local disks) write each piece at once."""
        return BufferedDataFile(self, path, recreate=recreate)

    @abstractmethod
    def commit_record(self, version: int, name: str, data: bytes, *, recreate: bool = True) -> None:
        """Writes chk-N/<name> atomically (all or nothing), replacing a previous one (``recreate``: as write_file)."""

    def commit_manifest(self, version: int, data: bytes) -> None:
        """Writes chk-N/_metadata atomically, replacing a previous one: this makes N visible."""
        self.commit_record(version, MANIFEST_NAME, data)

    def commit_lineage(self, version: int, commit_id: str, data: bytes) -> None:
        """Writes chk-N/_metadata-<commit id>, the lineage manifest of one commit of N (checkpoint format v2)."""
        self.commit_record(version, lineage_name(commit_id), data)

    def commit_compaction(self, version: int, data: bytes) -> None:
        """Writes chk-N/_snapshot; background work, so it never re-creates a deleted chk-N/."""
        self.commit_record(version, COMPACTION_NAME, data, recreate=False)

    # ------------------------------------------------------------- reading

    @abstractmethod
    def read_record(self, version: int, name: str) -> bytes | None:
        """chk-N/<name>, or None when it does not exist."""

    def read_manifest(self, version: int) -> bytes:
        """The manifest bytes of version N; VersionNotFound (or StateLost) when N cannot be restored."""
        data = self.read_record(version, MANIFEST_NAME)
        if data is None:
            raise self.version_not_found(version)
        return data

    def read_lineage(self, version: int, commit_id: str) -> bytes | None:
        """The lineage manifest of commit `commit_id` of version N, or None when there is none."""
        return self.read_record(version, lineage_name(commit_id))

    def read_version(self, version: int) -> tuple[bytes, bytes | None]:
        """(manifest, compaction record or None) of version N, read fresh from storage."""
        return self.read_manifest(version), self.read_record(version, COMPACTION_NAME)

    @abstractmethod
    def read_file(self, path: str, size: int | None = None) -> bytes:
        """A whole data file (``size``: what its manifest entry says it has, when the caller knows)."""

    @abstractmethod
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Byte ranges [start, end) of one data file, in one round trip where the backend allows. A range past the
        file's end gives the bytes it has (fewer, or none), as a local read does: the caller decides whether a
        short file is damage (a row image's reader does)."""

    def local_path(self, path: str) -> str | None:
        """`path` as a file of this machine's filesystem when the backend keeps its files on a local disk, else
        None. The JVM opens row images there itself (they are immutable; an open file outlives its deletion)."""
        return None

    def download(self, path: str, to: str) -> None:
        """Copies one data file to the local file `to` (a row image for a JVM where the files are remote)."""
        with open(to, "wb") as f:
            f.write(self.read_file(path))

    @abstractmethod
    def list_records(self, name: str) -> dict[int, str]:
        """Versions that have chk-N/<name> -> an opaque stamp that changes when it is rewritten."""

    def list_manifests(self) -> dict[int, str]:
        """Committed versions -> an opaque stamp that changes when the manifest is rewritten."""
        return self.list_records(MANIFEST_NAME)

    @abstractmethod
    def list_lineages(self) -> dict[tuple[int, str], str]:
        """Every lineage manifest chk-N/_metadata-<commit id>: (N, commit id) -> an opaque stamp."""

    def list_versions(self) -> list[int]:
        return sorted(self.list_manifests())

    @abstractmethod
    def list_files(self, prefix: str = SHARED_DIR) -> list[str]:
        """Paths (relative to the root) of every file under prefix/."""

    # ------------------------------------------------------------- deleting

    @abstractmethod
    def delete_version(self, version: int) -> None:
        """Removes chk-N/ (the manifest first: N stops being visible before anything else goes)."""

    @abstractmethod
    def delete_files(self, paths: Iterable[str]) -> None:
        """Removes data files; missing ones are ignored."""


class DataFileWriter(ABC):
    """One data file being written piece by piece: ``write`` the pieces, then ``close`` (the file is complete
    and durable when it returns) or ``discard`` (nothing is left of it)."""

    def __init__(self, path: str):
        self.path = path

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Appends bytes."""

    def sync(self) -> None:
        """Makes what was written so far durable where that is cheaper now than at ``close`` (a local disk)."""

    @abstractmethod
    def close(self) -> None:
        """Completes the file: it is written and durable (as ``write_file`` leaves a file)."""

    @abstractmethod
    def discard(self) -> None:
        """Drops the file and whatever was written of it; idempotent."""


class BufferedDataFile(DataFileWriter):
    """Pieces kept in memory, the file written whole at close: every backend can (objects are put whole)."""

    def __init__(self, storage: CheckpointStorage, path: str, *, recreate: bool = True):
        super().__init__(path)
        self._storage = storage
        self._recreate = recreate
        self._pieces: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._pieces.append(bytes(data))

    def close(self) -> None:
        data, self._pieces = b"".join(self._pieces), []
        self._storage.write_file(self.path, data, recreate=self._recreate)

    def discard(self) -> None:
        self._pieces = []
