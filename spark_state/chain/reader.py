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
import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from spark_state.chain.context import StoreContext
from spark_state.chain.merge import fold_changes, in_key_group_order, merge_chain
from spark_state.chain.references import Siblings
from spark_state.errors import (
    ChecksumMismatch, FileMissing, ProtocolError, SparkStateError, StaleState, StorageError, VersionNotFound,
)
from spark_state.format import datafile, rowimage
from spark_state.format.manifest import SNAPSHOT, CompactionRecord, FileEntry, ImageEntry, Manifest
from spark_state.format.tables import empty_table
from spark_state.keygroups import as_key_group_array, check_same_max_parallelism, filter_residue, slice_key_groups
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.layout import COMPACTION_NAME, lineage_name, manifest_path, record_path

log = logging.getLogger(__name__)

#: Files of one chain read at once from remote storage: a load or compaction on an object store waits about
#: one round trip per this many files instead of one per file, and a stalled request holds up one of them.
READ_AHEAD = 8
_pool: ThreadPoolExecutor | None = None
#: Deferred changes' reads (``load_lazy(defer=True)``): a pool of their own, as each waits on ``_read_pool``.
_deferred_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _remove_copy(path: str) -> None:
    """Deletes a copy of a row image the worker downloaded (never a checkpoint's file), if it is still there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_pool() -> ThreadPoolExecutor:
    """One pool for the process, made on first use (it only waits on storage; nothing in it waits on it)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="spark-state-read")
        return _pool


def _deferred_read_pool() -> ThreadPoolExecutor:
    """One pool for the process for deferred changes (their reads wait on ``_read_pool``, never the reverse)."""
    global _deferred_pool
    with _pool_lock:
        if _deferred_pool is None:
            _deferred_pool = ThreadPoolExecutor(2 * READ_AHEAD, thread_name_prefix="spark-state-deferred")
        return _deferred_pool


@dataclass(frozen=True)
class VersionView:
    """Version N as storage holds it now: its manifest, and its compaction record while that is valid."""

    manifest: Manifest
    record: CompactionRecord | None

    @property
    def chain(self) -> tuple[FileEntry, ...]:
        """The files that make up the version: the compacted snapshot when there is one, else the manifest's."""
        return (self.record.snapshot,) if self.record is not None else self.manifest.files

    @property
    def keys(self) -> int | None:
        """The keys of the state at this version when known without reading it: the manifest's count (a
        snapshot's rows, or what the shim counted), else the rows of a chain that is one whole snapshot."""
        if self.manifest.rows is not None:
            return self.manifest.rows
        chain = self.chain
        if len(chain) == 1 and chain[0].kind == SNAPSHOT and not chain[0].is_slice:
            return chain[0].rows
        return None


@dataclass(frozen=True)
class ImageFile:
    """A row image where the JVM can open it: the checkpoint's own file on a local disk, or a copy the worker
    downloaded (``temporary``: the JVM deletes it once it has it open); or, read by byte ranges from remote
    storage (``tail`` set, ``path`` None), its path in the store (``file``) and the bytes a reader needs before
    its first lookup (``rowimage.Tail``): the JVM fetches blocks as it needs them (request ``fetch``)."""

    path: str | None
    rows: int
    size: int
    temporary: bool
    file: str | None = None
    checksum: str | None = None
    tail: rowimage.Tail | None = None
    tail_read: int = 0   # bytes of the tail read from storage (none when its manifest entry holds it)

    @property
    def remote(self) -> bool:
        return self.tail is not None


@dataclass(frozen=True)
class Loaded:
    """A version as a restore sees it: its rows (None when the caller's copy is still current) and identity.

    With ``image`` (a lazy load, ``load_lazy``), the rows are not all here: ``image`` is the row image of the
    chain's snapshot and ``table`` only the changes after it (each key's last write, deletes as null values;
    None when there are none); ``file_format`` says whether the chain holds typed or opaque rows.
    ``keys``: how many keys the version holds, when known without counting them (``VersionView.keys``).
    ``bytes_read``: bytes of checkpoint data files the load read from storage (the chain's files, a row image
    downloaded whole or its tail read by range; not manifests, nor a local image it only names).
    ``deferred`` (``load_lazy(defer=True)``): the changes are still being read; ``table`` is None until they
    come (``DeferredChanges.result``).
    """

    table: pa.Table | None
    commit_id: str | None
    image: ImageFile | None = None
    file_format: int | None = None
    keys: int | None = None
    bytes_read: int = 0
    deferred: "DeferredChanges | None" = None


@dataclass(frozen=True)
class DeferredChanges:
    """The changes after a remote image, read in the background while the reader opens the image and fetches
    its first lookup's block (a restore waits one round trip of the storage less). ``rows``: the changes'
    rows before folding, an upper bound of what ``result`` has."""

    future: Future
    rows: int

    def result(self, timeout: float | None = None) -> tuple[pa.Table | None, int]:
        """The changes (None when there are none) and the bytes read for them; the read's error, if it failed."""
        return self.future.result(timeout)


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

    def read_lineage(self, version: int, commit_id: str, latest: Manifest | None = None) -> Manifest:
        """The manifest of commit `commit_id` of version N: the version's latest manifest when it is that commit,
        else its lineage manifest (``chk-N/_metadata-<commit id>``, written by commits under checkpoint format v2);
        VersionNotFound when storage holds no such commit. `latest`: the version's latest manifest, if just read."""
        storage = self.ctx.storage
        manifest = latest if latest is not None else self.read_manifest(version)
        if manifest.commit_id == commit_id:
            return manifest
        try:
            data = storage.read_lineage(version, commit_id)
        except ValueError as err:
            raise ProtocolError(f"checkpoint id of version {version} of {self.ctx.name}: {err}") from None
        if data is None:
            raise VersionNotFound(
                f"version {version} of state store {storage.root} has no commit {commit_id} (the checkpoint id "
                f"Spark's commit log names for it); storage holds commit {manifest.commit_id} as that version and "
                f"no lineage manifest {record_path(version, lineage_name(commit_id))}. The version was written "
                f"without checkpoint ids, or its files were deleted or replaced outside spark_state; restore an "
                f"older batch (spark-state restore) or start from a new checkpoint.")
        lineage = Manifest.from_json(data, f"{storage.root}/{record_path(version, lineage_name(commit_id))}")
        if lineage.version != version or lineage.commit_id != commit_id:
            raise StorageError(f"{storage.root}/{record_path(version, lineage_name(commit_id))} describes commit "
                               f"{lineage.commit_id} of version {lineage.version}, not commit {commit_id} of "
                               f"version {version}; the checkpoint directory was tampered with.")
        return lineage

    def view(self, version: int, lineage: str | None = None) -> VersionView:
        """Version N as storage holds it now (see VersionView); with `lineage`, its commit of that id (a commit
        under checkpoint format v2: the latest manifest, or the lineage manifest of that commit)."""
        manifest_bytes, record_bytes = self.ctx.storage.read_version(version)
        manifest = self._parse_manifest(version, manifest_bytes)
        if lineage is not None and manifest.commit_id != lineage:
            manifest = self.read_lineage(version, lineage, manifest)
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
                     ordered: bool = True, lineage: str | None = None) -> Loaded:
        """`version` with its commit id, read fresh from storage; no rows when it is still `known_commit_id`.
        `lineage`: the commit of `version` wanted (a checkpoint id of format v2), else the latest."""
        if version == 0:
            return Loaded(empty_table(), None, keys=0)
        if version < 0:
            raise self.ctx.storage.version_not_found(version)
        locks = self.ctx.locks
        with locks.lock:
            view = self.view(version, lineage)
            manifest = view.manifest
            if known_commit_id is not None and manifest.commit_id == known_commit_id:
                return Loaded(None, manifest.commit_id, keys=view.keys)
            chain = view.chain
            locks.pin(f.path for f in chain)
        try:
            self.check_parallelism(manifest)
            wanted = None if key_groups is None else as_key_group_array(key_groups, manifest.max_parallelism)
            tally: list[int] = []
            try:
                tables = self.read_chain(chain, wanted, tally)
            except StorageError:
                self._raise_if_dropped(version)
                raise
            if len(tables) == 1 and chain[0].kind == SNAPSHOT:
                table = in_key_group_order(tables[0]) if ordered else tables[0]
            else:
                table = merge_chain(tables, ordered=ordered)
            if key_groups is None and view.keys is not None and view.keys != table.num_rows:
                log.warning("%s version %d holds %d keys, its manifest says %d (the count a shim sent with the "
                            "commit was wrong); the rows read are the truth", self.ctx.name, version,
                            table.num_rows, view.keys)
            return Loaded(table, manifest.commit_id, keys=table.num_rows, bytes_read=sum(tally))
        finally:
            locks.unpin(f.path for f in chain)

    def load_lazy(self, version: int, known_commit_id: str | None = None, *, cache_dir: str,
                  ranges: bool = False, lineage: str | None = None, defer: bool = False) -> Loaded:
        """`version` for a reader that looks keys up in row images: when its chain starts with a snapshot
        that has one, that image and only the changes after it; else every row, as ``load_checked``. The image
        is opened where it is on a local disk; on remote storage, with ``ranges`` (a reader that fetches blocks
        by byte range, and ``rowImages.rangeReads`` for an image of its size), named with its tail (from its
        entry, format 6, else ``rowimage.read_tail``, read while the changes are), else copied whole into
        `cache_dir`. With ``defer`` too, an image whose entry holds its tail is named at once and its changes
        come in ``Loaded.deferred``. An image that is missing, damaged or not the size its entry says costs only
        the laziness: the rows are loaded instead (the image is never the truth).
        """
        if version <= 0:
            return self.load_checked(version, known_commit_id)
        locks = self.ctx.locks
        with locks.lock:
            view = self.view(version, lineage)
            if known_commit_id is not None and view.manifest.commit_id == known_commit_id:
                return Loaded(None, known_commit_id, keys=view.keys)
            chain = view.chain
            base = chain[0] if chain else None
            lazy = base is not None and base.image is not None and base.kind == SNAPSHOT and not base.is_slice
            if lazy:
                self._pin_chain(chain)
        if not lazy:
            return self.load_checked(version, known_commit_id, ordered=False, lineage=lineage)
        pinned = True
        try:
            self.check_parallelism(view.manifest)
            remote = ranges and self.ctx.settings.reads_by_range(base.image.size) and self.ctx.storage.local_path(
                base.image.path) is None
            tally: list[int] = []
            if remote and defer and self._deferrable(chain):
                image = self._image_tail(base.image)
                if image is None:
                    return self.load_checked(version, known_commit_id, ordered=False, lineage=lineage)
                deferred = self._defer_changes(version, chain)
                pinned = False   # the deferred read unpins the chain when it is done
                return Loaded(None, view.manifest.commit_id, image, base.file_format, view.keys,
                              bytes_read=image.tail_read, deferred=deferred)
            if remote:   # the tail and the changes at once: one round trip of the storage, not two
                pending = _read_pool().submit(self._image_tail, base.image)
                try:
                    changes = self._changes(version, chain, tally)
                finally:
                    image = pending.result()
                image_bytes = 0 if image is None else image.tail_read
            else:
                image = self._image_file(base.image, cache_dir)
                if image is not None:
                    try:
                        changes = self._changes(version, chain, tally)
                    except BaseException:
                        if image.temporary:   # a copy nobody will open: each of Spark's retries would add one
                            _remove_copy(image.path)
                        raise
                image_bytes = image.size if image is not None and image.temporary else 0
            if image is None:
                return self.load_checked(version, known_commit_id, ordered=False, lineage=lineage)
            return Loaded(changes, view.manifest.commit_id, image, base.file_format, view.keys,
                          bytes_read=sum(tally) + image_bytes)
        finally:
            if pinned:
                self._unpin_chain(chain)

    def _pin_chain(self, chain) -> None:
        """Keeps retention off a lazy load's files: the image's snapshot (and image) and the changes after it."""
        self.ctx.locks.pin(f.path for f in chain[1:])
        self.ctx.locks.pin(chain[0].paths)

    def _unpin_chain(self, chain) -> None:
        """Lets retention have a lazy load's files again (``load_lazy`` pinned the image and the changes)."""
        self.ctx.locks.unpin(f.path for f in chain[1:])
        self.ctx.locks.unpin(chain[0].paths)

    @staticmethod
    def _deferrable(chain) -> bool:
        """Whether a remote image's changes may come after its open: its entry holds its tail (no request for it),
        there are changes, and they are of the snapshot's file format (the reader takes it from the snapshot)."""
        base = chain[0]
        return (len(chain) > 1 and base.image.tail is not None
                and all(f.file_format == base.file_format for f in chain[1:]))

    def _defer_changes(self, version: int, chain) -> DeferredChanges:
        """Starts reading `chain`'s changes in the background; the read unpins the chain when done."""
        def read():
            try:
                return self._counted_changes(version, chain)
            finally:
                self._unpin_chain(chain)
        future = _deferred_read_pool().submit(read)   # if it raises, load_lazy still holds the pins and drops them
        return DeferredChanges(future, sum(f.rows for f in chain[1:]))

    def changes_after(self, version: int, commit_id: str, image_path: str, lineage: str | None = None) \
            -> tuple[pa.Table | None, int]:
        """The changes of commit `commit_id` of `version` after the row image at `image_path` (the ones a deferred
        load sent ``Loaded.deferred`` for, when that is gone: a new worker), and the bytes read for them.
        StaleState when storage no longer holds that commit over that image: the reader must load again."""
        locks = self.ctx.locks
        with locks.lock:
            view = self.view(version, lineage)
            chains = [view.chain, view.manifest.files]
            chain = next((c for c in chains if c and c[0].image is not None and c[0].image.path == image_path
                          and not c[0].is_slice), None)
            if view.manifest.commit_id != commit_id or chain is None:
                raise StaleState(f"{self.ctx.name}: version {version} is no longer commit {commit_id} over the row "
                                 f"image {image_path} (it was committed again, or its files rewritten, since it was "
                                 f"loaded); load it again.")
            self._pin_chain(chain)
        try:
            return self._counted_changes(version, chain)
        finally:
            self._unpin_chain(chain)

    def _counted_changes(self, version: int, chain) -> tuple[pa.Table | None, int]:
        """``_changes`` and the bytes read for them."""
        tally: list[int] = []
        return self._changes(version, chain, tally), sum(tally)

    def _changes(self, version: int, chain, tally: list[int]) -> pa.Table | None:
        """The changes after a chain's snapshot, each key's last write (``fold_changes``)."""
        try:
            return fold_changes(self.read_chain(chain[1:], None, tally))
        except StorageError:
            self._raise_if_dropped(version)
            raise

    def _image_tail(self, image: ImageEntry) -> ImageFile | None:
        """A remote image named for range reads, with its tail; None (logged) when it cannot be used."""
        storage = self.ctx.storage
        name = f"{storage.root}/{image.path}"
        read: list[int] = []

        def fetch(ranges):
            chunks = storage.read_ranges(image.path, ranges)
            read.extend(len(c) for c in chunks)
            return chunks
        try:
            try:
                tail = rowimage.read_tail(fetch, name, image.size, image.rows, known=image.tail_bytes)
            except SparkStateError as err:
                if image.tail is None:
                    raise
                log.warning("the manifest entry of row image %s holds a tail that cannot be used (%s); reading the "
                            "image's own", name, err)
                tail = rowimage.read_tail(fetch, name, image.size, image.rows)
        except (OSError, SparkStateError) as err:
            log.warning("row image %s of %s cannot be used (%s); loading the rows instead", name, self.ctx.name, err)
            return None
        return ImageFile(None, image.rows, image.size, False, file=image.path, checksum=image.checksum, tail=tail,
                         tail_read=sum(read))

    def fetch(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges of one of this store's files, for a reader of a remote row image (request ``fetch``):
        exactly the bytes asked for. A file that is gone, or shorter than asked, is ChecksumMismatch: not the file
        its manifest names (the reader drops the image and loads rows, as for a damaged block; a failed read of
        storage is a StorageError, and the read may be tried again)."""
        storage = self.ctx.storage
        try:
            chunks = storage.read_ranges(path, ranges)
        except FileMissing as err:
            if not self._named_now(path):   # retention dropped it with the versions that named it: not damage
                raise
            raise ChecksumMismatch(str(err)) from None
        for (start, end), chunk in zip(ranges, chunks):
            if len(chunk) != end - start:
                raise ChecksumMismatch(f"{storage.root}/{path} has no bytes {start}..{end} (got {len(chunk)}): it is "
                                       f"shorter than the manifest that names it says; it was truncated or replaced.")
        return chunks

    def _named_now(self, path: str) -> bool:
        """Whether the store's newest version (its manifest or compaction record) names the file at `path`."""
        latest = self.latest_version()
        if latest is None:
            return False
        try:
            view = self.view(latest)
        except VersionNotFound:
            return False
        return any(path in f.paths for f in (*view.manifest.files, *view.chain))

    def _image_file(self, image: ImageEntry, cache_dir: str) -> ImageFile | None:
        storage = self.ctx.storage
        local = storage.local_path(image.path)
        temporary = local is None
        try:
            if temporary:
                os.makedirs(cache_dir, mode=0o700, exist_ok=True)
                fd, local = tempfile.mkstemp(suffix=".img", dir=cache_dir)
                os.close(fd)
                try:
                    storage.download(image.path, local)
                except BaseException:
                    _remove_copy(local)
                    raise
            size = os.path.getsize(local)
        except (OSError, SparkStateError) as err:
            log.warning("row image %s/%s of %s cannot be opened (%s); loading the rows instead", storage.root,
                        image.path, self.ctx.name, err)
            size = None
        if size != image.size:
            if size is not None:
                log.warning("row image %s/%s of %s has %d bytes, its entry says %d; loading the rows instead",
                            storage.root, image.path, self.ctx.name, size, image.size)
            if temporary and local is not None:
                _remove_copy(local)
            return None
        return ImageFile(local, image.rows, image.size, temporary)

    def _raise_if_dropped(self, version: int) -> None:
        """A file went missing under a load because retention dropped the version meanwhile: say so."""
        try:
            self.ctx.storage.read_manifest(version)
        except VersionNotFound:
            raise self.ctx.storage.version_not_found(version) from None

    # ------------------------------------------------------------- data files

    def read_chain(self, entries, key_groups: np.ndarray | None, tally: list[int] | None = None) -> list[pa.Table]:
        """The rows of each entry, in order (``read``); from remote storage up to READ_AHEAD files at once.
        `tally`: gets the byte count of each read from storage appended (a list: appends are thread safe)."""
        entries = list(entries)
        if len(entries) < 2 or not self.ctx.storage.remote:
            return [self.read(entry, key_groups, tally) for entry in entries]
        return list(_read_pool().map(lambda entry: self.read(entry, key_groups, tally), entries))

    def read(self, entry: FileEntry, key_groups: np.ndarray | None, tally: list[int] | None = None) -> pa.Table:
        """The rows of one chain entry (all, or only `key_groups`), verified as read (`tally`: as ``read_chain``)."""
        if entry.is_slice:
            return self._read_slice(entry, key_groups, tally)
        return self._read_file(self.ctx.storage, entry, key_groups, tally)

    def _read_file(self, storage: CheckpointStorage, entry: FileEntry, key_groups: np.ndarray | None,
                   tally: list[int] | None = None) -> pa.Table:
        settings = self.ctx.settings
        verify = settings.verify_checksums
        name = f"{storage.root}/{entry.path}"
        if key_groups is None:
            data = storage.read_file(entry.path, entry.size)
            if tally is not None:
                tally.append(len(data))
            if verify:
                datafile.check_whole(data, name, entry.size, entry.checksum)
            return datafile.decode(data, name, settings.max_parallelism, verified=verify)
        if len(key_groups) == 0 and not entry.typed:
            return empty_table()

        def read_ranges(ranges):
            chunks = storage.read_ranges(entry.path, ranges)
            if tally is not None:
                tally.append(sum(len(c) for c in chunks))
            return chunks
        return datafile.read_key_groups(read_ranges, name,
                                        entry.index_offset, entry.index_length, entry.index_checksum,
                                        key_groups, verify, file_format=entry.file_format,
                                        max_parallelism=settings.max_parallelism, checksum=entry.checksum)

    def _read_slice(self, entry: FileEntry, key_groups: np.ndarray | None,
                    tally: list[int] | None = None) -> pa.Table:
        """The rows of a (maybe another partition's) file that belong here: whole key groups by byte range,
        filtered by hash when the slice's modulus does not divide the max parallelism."""
        storage = self.ctx.storage if entry.partition is None else self.sibling(entry.partition)
        wanted, by_hash = key_groups, False
        if entry.modulus is not None:
            kgs, by_hash = slice_key_groups(entry.modulus, entry.residue, self.ctx.settings.max_parallelism)
            wanted = kgs if key_groups is None else np.intersect1d(kgs, key_groups, assume_unique=True)
        table = self._read_file(storage, entry, wanted, tally)
        return filter_residue(table, entry.modulus, entry.residue) if by_hash else table

    def open_entry(self, entry: FileEntry) -> "EntryReader":
        """One chain entry opened for reading by key-group ranges or batch by batch (``spark_state.chain.ranges``):
        its index and head read and checked once."""
        storage = self.ctx.storage if entry.partition is None else self.sibling(entry.partition)
        settings = self.ctx.settings
        opened = datafile.IndexedFile(lambda ranges: storage.read_ranges(entry.path, ranges),
                                      f"{storage.root}/{entry.path}", entry.index_offset, entry.index_length,
                                      entry.index_checksum, settings.verify_checksums, file_format=entry.file_format,
                                      max_parallelism=settings.max_parallelism, checksum=entry.checksum)
        return EntryReader(opened, entry, settings.max_parallelism)

    def sibling(self, partition: int) -> CheckpointStorage:
        """The storage of `partition`'s store (same operator and name), for slices and reference records."""
        if self.siblings is None:
            raise StorageError(f"{self.ctx.name}: a manifest names a file of partition {partition}'s store (a "
                               f"rescaled checkpoint), but this store was opened without access to its siblings.")
        if partition not in self._sibling_storages:
            self._sibling_storages[partition] = self.siblings(partition)
        return self._sibling_storages[partition]


class EntryReader:
    """A chain entry's rows by key-group subsets or batch by batch; a slice (format 3) only its own rows."""

    def __init__(self, opened: datafile.IndexedFile, entry: FileEntry, max_parallelism: int):
        self.file, self.entry = opened, entry
        self._kgs, self._by_hash = None, False
        if entry.modulus is not None:
            self._kgs, self._by_hash = slice_key_groups(entry.modulus, entry.residue, max_parallelism)

    @property
    def batches_in_key_group_order(self) -> bool:
        return self.file.batches_in_key_group_order

    def read(self, key_groups: np.ndarray) -> pa.Table:
        """The entry's rows of these key groups."""
        wanted = key_groups if self._kgs is None else np.intersect1d(self._kgs, key_groups, assume_unique=True)
        return self._own(self.file.read(wanted))

    def batches(self) -> Iterator[pa.Table]:
        """All the entry's rows, a few of the file's batches at a time, in the file's order."""
        for table in self.file.batches():
            if self._kgs is not None:
                keep = np.isin(table.column("kg").to_numpy(), self._kgs)
                table = table if keep.all() else table.filter(pa.array(keep))
            yield self._own(table)

    def _own(self, table: pa.Table) -> pa.Table:
        return filter_residue(table, self.entry.modulus, self.entry.residue) if self._by_hash else table
