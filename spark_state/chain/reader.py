"""Every read of one store's chain: manifests, compaction records, chains, data files, whole versions.

What a version is, as storage holds it *now*: its manifest, read fresh, and
its compaction record while that still folds this very manifest
(``VersionView``; docs/consistency.md, rule 3). Reading a chain's files
verifies them against their manifest entries; a file of a rescaled chain may
be a slice of another partition's file (format 3), read from that sibling
store. Loads pin the files they read, so retention in this process leaves
them alone (rule 4).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from spark_state.chain.context import StoreContext
from spark_state.chain.merge import merge_chain
from spark_state.chain.references import Siblings
from spark_state.errors import SparkStateError, StorageError, VersionNotFound
from spark_state.format import datafile
from spark_state.format.manifest import SNAPSHOT, CompactionRecord, FileEntry, Manifest
from spark_state.format.tables import empty_table
from spark_state.keygroups import as_key_group_array, check_same_max_parallelism, filter_residue, slice_key_groups
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.layout import COMPACTION_NAME, manifest_path, record_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionView:
    """Version N as storage holds it now: its manifest, and its compaction record while that is valid."""

    manifest: Manifest
    record: CompactionRecord | None

    @property
    def chain(self) -> tuple[FileEntry, ...]:
        """The files that make up the version: the compacted snapshot when there is one, else the manifest's."""
        return (self.record.snapshot,) if self.record is not None else self.manifest.files


@dataclass(frozen=True)
class Loaded:
    """A version as a restore sees it: its rows (None when the caller's copy is still current) and identity."""

    table: pa.Table | None
    commit_id: str | None


class ChainReader:
    """The public read API of one store (see the module docstring)."""

    def __init__(self, ctx: StoreContext, partition: int | None = None, siblings: Siblings | None = None):
        self.ctx = ctx
        # After a rescale, chains name files of other partitions' stores (manifest format 3):
        self.partition = partition
        self.siblings = siblings
        self._sibling_storages: dict[int, CheckpointStorage] = {}

    # ------------------------------------------------------------- versions

    def versions(self) -> list[int]:
        return self.ctx.storage.list_versions()

    def latest_version(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def read_manifest(self, version: int) -> Manifest:
        """Manifest N, read fresh from storage; VersionNotFound when there is none."""
        return self._parse_manifest(version, self.ctx.storage.read_manifest(version))

    def _parse_manifest(self, version: int, data: bytes) -> Manifest:
        root = self.ctx.storage.root
        manifest = Manifest.from_json(data, f"{root}/{manifest_path(version)}")
        if manifest.version != version:
            raise StorageError(f"{root}/{manifest_path(version)} describes version {manifest.version}, "
                               f"not {version}; the checkpoint directory was tampered with.")
        return manifest

    def view(self, version: int) -> VersionView:
        """Version N as storage holds it now (see VersionView)."""
        manifest_bytes, record_bytes = self.ctx.storage.read_version(version)
        manifest = self._parse_manifest(version, manifest_bytes)
        record = None
        if record_bytes is not None:
            try:
                record = CompactionRecord.from_json(
                    record_bytes, f"{self.ctx.storage.root}/{record_path(version, COMPACTION_NAME)}")
            except SparkStateError as err:   # an unusable record only costs speed: the manifest is the truth
                log.warning("ignoring compaction record of %s version %d: %s", self.ctx.name, version, err)
            else:
                if record.commit_id != manifest.commit_id or record.version != version:
                    record = None   # version N was re-committed after its compaction
        return VersionView(manifest, record)

    def check_parallelism(self, manifest: Manifest) -> None:
        check_same_max_parallelism(manifest.max_parallelism, self.ctx.settings.max_parallelism,
                                   f"state store {self.ctx.name} (version {manifest.version})")

    # ------------------------------------------------------------- whole versions

    def load_checked(self, version: int, known_commit_id: str | None = None, *, key_groups=None,
                     ordered: bool = True) -> Loaded:
        """`version` with its commit id, read fresh from storage; no rows when it is still `known_commit_id`."""
        if version == 0:
            return Loaded(empty_table(), None)
        if version < 0:
            raise self.ctx.storage.version_not_found(version)
        locks = self.ctx.locks
        with locks.lock:
            view = self.view(version)
            manifest = view.manifest
            if known_commit_id is not None and manifest.commit_id == known_commit_id:
                return Loaded(None, manifest.commit_id)
            chain = view.chain
            locks.pin(f.path for f in chain)
        try:
            self.check_parallelism(manifest)
            wanted = None if key_groups is None else as_key_group_array(key_groups, manifest.max_parallelism)
            try:
                tables = [self.read(entry, wanted) for entry in chain]
            except StorageError:
                self._raise_if_dropped(version)
                raise
            if len(tables) == 1 and chain[0].kind == SNAPSHOT:
                return Loaded(tables[0], manifest.commit_id)
            return Loaded(merge_chain(tables, ordered=ordered), manifest.commit_id)
        finally:
            locks.unpin(f.path for f in chain)

    def _raise_if_dropped(self, version: int) -> None:
        """A file went missing under a load because retention dropped the version meanwhile: say so."""
        try:
            self.ctx.storage.read_manifest(version)
        except VersionNotFound:
            raise self.ctx.storage.version_not_found(version) from None

    # ------------------------------------------------------------- data files

    def read(self, entry: FileEntry, key_groups: np.ndarray | None) -> pa.Table:
        """The rows of one chain entry (all, or only `key_groups`), verified as read."""
        if entry.is_slice:
            return self._read_slice(entry, key_groups)
        return self._read_file(self.ctx.storage, entry, key_groups)

    def _read_file(self, storage: CheckpointStorage, entry: FileEntry, key_groups: np.ndarray | None) -> pa.Table:
        settings = self.ctx.settings
        verify = settings.verify_checksums
        name = f"{storage.root}/{entry.path}"
        if key_groups is None:
            data = storage.read_file(entry.path)
            if verify:
                datafile.check_whole(data, name, entry.size, entry.checksum)
            return datafile.decode(data, name, settings.max_parallelism)
        if len(key_groups) == 0 and not entry.typed:
            return empty_table()
        return datafile.read_key_groups(lambda ranges: storage.read_ranges(entry.path, ranges), name,
                                        entry.index_offset, entry.index_length, entry.index_checksum,
                                        key_groups, verify, file_format=entry.file_format,
                                        max_parallelism=settings.max_parallelism)

    def _read_slice(self, entry: FileEntry, key_groups: np.ndarray | None) -> pa.Table:
        """The rows of a (maybe another partition's) file that belong here: whole key groups by byte range,
        filtered by hash when the slice's modulus does not divide the max parallelism."""
        storage = self.ctx.storage if entry.partition is None else self.sibling(entry.partition)
        wanted, by_hash = key_groups, False
        if entry.modulus is not None:
            kgs, by_hash = slice_key_groups(entry.modulus, entry.residue, self.ctx.settings.max_parallelism)
            wanted = kgs if key_groups is None else np.intersect1d(kgs, key_groups, assume_unique=True)
        table = self._read_file(storage, entry, wanted)
        return filter_residue(table, entry.modulus, entry.residue) if by_hash else table

    def sibling(self, partition: int) -> CheckpointStorage:
        """The storage of `partition`'s store (same operator and name), for slices and reference records."""
        if self.siblings is None:
            raise StorageError(f"{self.ctx.name}: a manifest names a file of partition {partition}'s store (a "
                               f"rescaled checkpoint), but this store was opened without access to its siblings.")
        if partition not in self._sibling_storages:
            self._sibling_storages[partition] = self.siblings(partition)
        return self._sibling_storages[partition]
