"""CheckpointStorage: where a store's versions live, independent of the file format.

One spec, many backends (Flink's ``CheckpointStorage``, fsspec's
``AbstractFileSystem``): the version chain logic in ``spark_state.state``
only ever calls the methods below, with paths relative to the store's root.

Layout under the root (Flink's)::

    chk-N/_metadata     the manifest of version N; writing it makes N visible
    chk-N/_snapshot     compaction record of version N (optional): a full
                        snapshot of N's state, valid while N's manifest
                        keeps the commit id it names. Compaction never
                        rewrites a manifest, so what a manifest references
                        stays referenced for as long as the version is kept.
    shared/vNNNNNNNNNN-<kind>-<random>.arrow
                        data files (snapshots and deltas); later versions'
                        chains reference them, so they are shared. The
                        random part means a re-commit never overwrites a file
                        a manifest names; the version part lets retention
                        tell a crashed commit's leftovers from an in-flight one.
    taskowned/          not used: every file here is referenced through
                        manifests, so nothing is owned by a task alone. It is
                        never created.

Data is always written before the manifest that names it, and a manifest
names only complete files, so a crash between the two leaves an
unreferenced file for retention to collect, never a half-visible version.
"""

from __future__ import annotations

import re
import secrets
from abc import ABC, abstractmethod
from typing import Iterable, Sequence

from spark_state.errors import VersionNotFound

MANIFEST_NAME = "_metadata"
COMPACTION_NAME = "_snapshot"
SHARED_DIR = "shared"
_CHK = re.compile(r"^chk-(\d+)$")
_SHARED = re.compile(r"^shared/v(\d+)-([a-z]+)-([0-9a-f]+)\.arrow$")


def manifest_path(version: int) -> str:
    return f"chk-{version}/{MANIFEST_NAME}"


def record_path(version: int, name: str) -> str:
    """Path of one of version N's records (``_metadata``, ``_snapshot``)."""
    return f"chk-{version}/{name}"


def version_dir_of(name: str) -> int | None:
    """The N of a 'chk-N' directory name, else None."""
    m = _CHK.match(name)
    return int(m.group(1)) if m else None


def file_version(path: str) -> int | None:
    """The version a shared data file was written for, from its name; None for foreign files."""
    m = _SHARED.match(path)
    return int(m.group(1)) if m else None


def format_versions(versions: Sequence[int]) -> str:
    """'1-5, 8' for [1, 2, 3, 4, 5, 8]; 'none' when empty."""
    if not versions:
        return "none"
    runs, start, prev = [], versions[0], versions[0]
    for v in list(versions[1:]) + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(runs)


class CheckpointStorage(ABC):
    """Files of one store (one operator, partition and store name), addressed relative to its root."""

    kind: str = "abstract"

    def __init__(self, root: str):
        self.root = root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    # ------------------------------------------------------------- naming

    @staticmethod
    def new_file_path(version: int, kind: str) -> str:
        """A fresh, never-reused path in shared/ for a data file written for `version`."""
        return f"{SHARED_DIR}/v{version:010d}-{kind}-{secrets.token_hex(8)}.arrow"

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

    @abstractmethod
    def commit_record(self, version: int, name: str, data: bytes, *, recreate: bool = True) -> None:
        """Writes chk-N/<name> atomically (all or nothing), replacing a previous one (``recreate``: as write_file)."""

    def commit_manifest(self, version: int, data: bytes) -> None:
        """Writes chk-N/_metadata atomically, replacing a previous one: this makes N visible."""
        self.commit_record(version, MANIFEST_NAME, data)

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

    def read_version(self, version: int) -> tuple[bytes, bytes | None]:
        """(manifest, compaction record or None) of version N, read fresh from storage."""
        return self.read_manifest(version), self.read_record(version, COMPACTION_NAME)

    @abstractmethod
    def read_file(self, path: str) -> bytes:
        """A whole data file."""

    @abstractmethod
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Byte ranges [start, end) of one data file, in one round trip where the backend allows."""

    @abstractmethod
    def list_records(self, name: str) -> dict[int, str]:
        """Versions that have chk-N/<name> -> an opaque stamp that changes when it is rewritten."""

    def list_manifests(self) -> dict[int, str]:
        """Committed versions -> an opaque stamp that changes when the manifest is rewritten."""
        return self.list_records(MANIFEST_NAME)

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
