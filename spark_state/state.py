"""Versioned state of one Spark state store: commit, load, compaction, retention.

A version is a chain: a full snapshot (or nothing) followed by deltas, one per
commit since. ``commit`` is on Spark's critical path, so it writes exactly one
data file (the delta) and one manifest, building on the previous version's
chain, which it keeps in memory. ``maintenance`` (a background thread in the
worker) folds long chains into a new snapshot and deletes what no retained
version needs.

Concurrency, within one process (one VersionedStore per root, see
``open_store``): a per-store lock serialises commits, manifest swaps and
deletions; loads and compactions read without it but *pin* the files they
use, and deletion never touches a pinned file. Across processes Spark runs one
task per store at a time; a file written for a version newer than the newest
manifest may belong to someone's in-flight commit and is never collected.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_state import snapshot
from spark_state.errors import ProtocolError, SparkStateError, StateTooLarge, StorageError
from spark_state.keygroups import as_key_group_array, check_max_parallelism, check_same_max_parallelism, key_groups_of
from spark_state.manifest import DELTA, SNAPSHOT, FileEntry, Manifest
from spark_state.options import Settings
from spark_state.snapshot import CHANGES_SCHEMA
from spark_state.storage import CheckpointStorage, resolve_root, storage_for
from spark_state.storage.base import file_version, manifest_path

log = logging.getLogger(__name__)

#: Manifests kept in memory per store (retention re-reads only those whose listing stamp changed).
_CACHE_LIMIT = 1024

__all__ = ["CHANGES_SCHEMA", "StoreRef", "CommitResult", "VersionedStore", "open_store", "merge_chain"]


@dataclass(frozen=True)
class StoreRef:
    """One Spark state store: (operator, partition, storeName) of one query."""

    spark_root: str   # StateStoreId.checkpointRootLocation, e.g. "file:/tmp/q/state"
    location: str     # StateStoreId.storeCheckpointLocation URI, e.g. "file:/tmp/q/state/0/3"
    operator: int
    partition: int
    name: str = "default"


@dataclass(frozen=True)
class CommitResult:
    bytes_written: int   # data file + manifest
    files: int           # files written (the data file and the manifest)


def _fold_deltas(tables: list[pa.Table]) -> pa.Table:
    """Last write per key over several tables (oldest first), deletes kept as null values.

    A hash group-by on the key picks each key's last row position in the
    concatenation; measured 2x faster than a sort by (kg, hash, key, seq).
    """
    combined = pa.concat_tables(tables)
    position = pa.array(np.arange(combined.num_rows, dtype=np.int64))
    last = (pa.table({"key": combined.column("key"), "position": position})
            .group_by("key", use_threads=False).aggregate([("position", "max")]))
    return combined.take(last.column("position_max"))


def merge_chain(tables: list[pa.Table], *, ordered: bool = True) -> pa.Table:
    """Folds a chain (oldest first) into the state: last write per key wins, deletes drop the key.

    Vectorised, and the big base table is never sorted: the deltas are folded
    among themselves (they are small), then the base keeps only the rows whose
    key no delta touches (a hash lookup, ``is_in``). Each table holds at most
    one row per key (the commit contract). ``ordered`` sorts the result by key
    group, which files need and a restore into the JVM's hash map does not.
    """
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return snapshot.empty_table()
    base, deltas = tables[0], tables[1:]
    if deltas:
        newer = deltas[0] if len(deltas) == 1 else _fold_deltas(deltas)
        untouched = pc.invert(pc.is_in(base.column("key"), value_set=newer.column("key").combine_chunks()))
        merged = pa.concat_tables([base.filter(untouched), newer])
    else:
        merged = base
    merged = merged.filter(merged.column("value").is_valid())
    if ordered and len(tables) > 1:
        merged = merged.take(np.argsort(merged.column("kg").to_numpy(), kind="stable"))
    return merged


class VersionedStore:
    """The versions of one store in one checkpoint storage (see module docstring)."""

    def __init__(self, storage: CheckpointStorage, settings: Settings, name: str | None = None):
        self.storage = storage
        self.settings = settings
        self.name = name or storage.root
        self._lock = threading.RLock()
        self._maintenance_lock = threading.Lock()
        self._latest: Manifest | None = None                  # newest manifest this instance wrote or read
        self._cache: dict[int, tuple[str | None, Manifest]] = {}   # version -> (listing stamp, manifest)
        self._pins: collections.Counter[str] = collections.Counter()
        self._rebase: tuple[tuple[str, ...], FileEntry] | None = None  # old chain prefix -> compacted snapshot
        self._deferred: SparkStateError | None = None          # a maintenance failure to surface on commit

    def __repr__(self) -> str:
        return f"VersionedStore({self.name!r}, {self.storage.kind})"

    def update_settings(self, settings: Settings) -> None:
        if settings.memory_max_state_size != self.settings.memory_max_state_size:
            self._deferred = None   # a raised limit deserves another compaction attempt
        self.settings = settings
        if hasattr(self.storage, "max_state_size"):
            self.storage.max_state_size = settings.memory_max_state_size

    # ------------------------------------------------------------- manifests

    def _read_manifest(self, version: int) -> Manifest:
        manifest = Manifest.from_json(self.storage.read_manifest(version), f"{self.storage.root}/{manifest_path(version)}")
        if manifest.version != version:
            raise StorageError(f"{self.storage.root}/{manifest_path(version)} describes version {manifest.version}, "
                               f"not {version}; the checkpoint directory was tampered with.")
        return manifest

    def _check_parallelism(self, manifest: Manifest) -> None:
        check_same_max_parallelism(manifest.max_parallelism, self.settings.max_parallelism,
                                   f"state store {self.name} (version {manifest.version})")

    def _pin(self, paths: Iterable[str]) -> None:
        self._pins.update(paths)

    def _unpin(self, paths: Iterable[str]) -> None:
        with self._lock:
            self._pins.subtract(paths)
            self._pins += collections.Counter()   # drops zero counts

    # ------------------------------------------------------------- commit

    def _check_changes(self, changes: pa.Table) -> pa.Table:
        try:
            changes = snapshot.conform(changes)
        except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ProtocolError(f"changes for {self.name} do not match {CHANGES_SCHEMA}: {err}") from None
        m = self.settings.max_parallelism
        if changes.num_rows:
            if changes.column("kg").null_count or changes.column("hash").null_count or changes.column("key").null_count:
                raise ProtocolError(f"changes for {self.name} have nulls in kg, hash or key; only value may be null.")
            expected = key_groups_of(changes.column("hash"), m)
            if not np.array_equal(expected, changes.column("kg").to_numpy(zero_copy_only=False)):
                raise ProtocolError(
                    f"changes for {self.name} carry key groups that are not pmod(hash, {m}); the shim and the "
                    f"worker disagree on spark.sql.streaming.stateStore.sparkState.maxParallelism."
                )
        return changes

    def commit(self, version: int, changes: pa.Table) -> CommitResult:
        """Makes `version` = version-1 + changes durable (see module docstring). Replaces an existing `version`."""
        if version < 1:
            raise ProtocolError(f"cannot commit version {version} of {self.name}: versions start at 1.")
        check_max_parallelism(self.settings.max_parallelism)
        changes = self._check_changes(changes)
        with self._lock:
            if self._deferred is not None:
                raise self._deferred
            base = self._base(version - 1)
            if base is not None:
                self._check_parallelism(base)
            elif self._latest is not None:
                self._check_parallelism(self._latest)
            chain: tuple[FileEntry, ...] = base.files if base is not None else ()
            if self._rebase is not None and chain[:len(self._rebase[0])] and \
                    tuple(f.path for f in chain[:len(self._rebase[0])]) == self._rebase[0]:
                chain = (self._rebase[1],) + chain[len(self._rebase[0]):]
            if chain:
                kind, rows = DELTA, changes
            else:   # building on the empty state: the changes are the whole state
                kind, rows = SNAPSHOT, changes.filter(changes.column("value").is_valid())
            encoded = snapshot.encode(rows, self.settings.compression_level)
            path = self.storage.new_file_path(version, kind)
            self.storage.write_file(path, encoded.data)
            entry = _entry(path, kind, version, encoded)
            manifest = Manifest(version, self.settings.max_parallelism, chain + (entry,),
                                rows=encoded.rows if kind == SNAPSHOT else None)
            body = manifest.to_json()
            try:
                self.storage.commit_manifest(version, body)
            except BaseException:
                self.storage.delete_files([path])
                raise
            self._cache[version] = (None, manifest)
            if len(self._cache) > _CACHE_LIMIT:   # maintenance normally trims it; bound it anyway
                for old in sorted(self._cache)[:len(self._cache) - _CACHE_LIMIT]:
                    del self._cache[old]
            if self._latest is None or version >= self._latest.version:
                self._latest = manifest
            log.debug("committed %s version %d: %d rows, %d bytes", self.name, version, encoded.rows, encoded.size)
            return CommitResult(encoded.size + len(body), 2)

    def _base(self, version: int) -> Manifest | None:
        if version == 0:
            return None
        if self._latest is not None and self._latest.version == version:
            return self._latest
        return self._read_manifest(version)

    # ------------------------------------------------------------- load

    def load(self, version: int, key_groups=None, *, ordered: bool = True) -> pa.Table:
        """The full state at `version` (or only `key_groups`), without deletes; sorted by key group
        unless ``ordered=False`` (a restore into a hash map does not need the order)."""
        if version == 0:
            return snapshot.empty_table()
        if version < 0:
            raise self.storage.version_not_found(version)
        with self._lock:
            manifest = self._read_manifest(version)   # always fresh: another process may have re-committed it
            self._pin(manifest.paths)
        try:
            self._check_parallelism(manifest)
            wanted = None if key_groups is None else as_key_group_array(key_groups, manifest.max_parallelism)
            tables = [self._read(entry, wanted) for entry in manifest.files]
            if len(tables) == 1 and manifest.files[0].kind == SNAPSHOT:
                return tables[0]
            return merge_chain(tables, ordered=ordered)
        finally:
            self._unpin(manifest.paths)

    def _read(self, entry: FileEntry, key_groups: np.ndarray | None) -> pa.Table:
        verify = self.settings.verify_checksums
        name = f"{self.storage.root}/{entry.path}"
        if key_groups is None:
            data = self.storage.read_file(entry.path)
            if verify:
                snapshot.check_whole(data, name, entry.size, entry.checksum)
            return snapshot.decode(data, name)
        if len(key_groups) == 0:
            return snapshot.empty_table()
        return snapshot.read_key_groups(lambda ranges: self.storage.read_ranges(entry.path, ranges), name,
                                        entry.index_offset, entry.index_length, entry.index_checksum,
                                        key_groups, verify)

    # ------------------------------------------------------------- listing

    def versions(self) -> list[int]:
        return self.storage.list_versions()

    def latest_version(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    # ------------------------------------------------------------- abort

    def abort(self, version: int) -> None:
        """Removes files written for `version` that no manifest names (a commit that died before its manifest)."""
        with self._lock:
            referenced = set(self._pins)
            for v in self.storage.list_versions():
                if v >= version:
                    try:
                        referenced.update(self._read_manifest(v).paths)
                    except SparkStateError:
                        return   # cannot tell what is referenced: delete nothing
            leftovers = [p for p in self.storage.list_files() if file_version(p) == version and p not in referenced]
            if leftovers:
                log.info("abort %s version %d: removing %d unreferenced file(s)", self.name, version, len(leftovers))
                self.storage.delete_files(leftovers)

    # ------------------------------------------------------------- maintenance

    def maintenance(self, min_versions_to_retain: int) -> None:
        """Compaction, then retention. One run per store at a time; a concurrent call returns at once."""
        if not self._maintenance_lock.acquire(blocking=False):
            return
        try:
            try:
                self._compact()
            except StateTooLarge as err:
                log.warning("compaction of %s failed: %s", self.name, err)
                self._deferred = err
            self._retain(max(1, int(min_versions_to_retain)))
        finally:
            self._maintenance_lock.release()

    def _compact(self) -> None:
        with self._lock:
            latest = self._latest
            if latest is None:
                versions = self.storage.list_versions()
                if not versions:
                    return
                latest = self._read_manifest(versions[-1])
            if sum(f.kind == DELTA for f in latest.files) < self.settings.snapshot_interval:
                return
            self._pin(latest.paths)
        path = None
        try:
            self._check_parallelism(latest)
            state = merge_chain([self._read(entry, None) for entry in latest.files])
            encoded = snapshot.encode(state, self.settings.compression_level, sorted_by_kg=True)
            path = self.storage.new_file_path(latest.version, SNAPSHOT)
            with self._lock:
                self._pin([path])
            self.storage.write_file(path, encoded.data)
            entry = _entry(path, SNAPSHOT, latest.version, encoded)
            compacted = Manifest(latest.version, latest.max_parallelism, (entry,), rows=encoded.rows)
            with self._lock:
                try:
                    current = self._read_manifest(latest.version)
                except SparkStateError:
                    current = None
                if current is None or current.commit_id != latest.commit_id:
                    log.info("compaction of %s version %d skipped: the version changed meanwhile", self.name,
                             latest.version)
                    self._unpin([path])
                    self.storage.delete_files([path])
                    return
                self.storage.commit_manifest(latest.version, compacted.to_json())
                self._cache[latest.version] = (None, compacted)
                if self._latest is not None and self._latest.version == latest.version:
                    self._latest = compacted
                if self._rebase is not None:
                    self._unpin([self._rebase[1].path])
                self._rebase = (tuple(latest.paths), entry)   # keeps `path` pinned while commits may rebase on it
                self._deferred = None
                log.info("compacted %s version %d: %d deltas -> snapshot of %d rows (%d bytes)", self.name,
                         latest.version, latest.deltas_since_snapshot, encoded.rows, encoded.size)
        except BaseException:
            if path is not None and (self._rebase is None or self._rebase[1].path != path):
                self._unpin([path])
            raise
        finally:
            self._unpin(latest.paths)

    def _manifests(self, versions: list[int], stamps: dict[int, str]) -> dict[int, Manifest]:
        """Manifests of `versions`, re-read only where the listing stamp changed since they were cached."""
        out = {}
        for v in versions:
            cached = self._cache.get(v)
            if cached is not None and cached[0] is not None and cached[0] == stamps.get(v):
                out[v] = cached[1]
                continue
            manifest = self._read_manifest(v)
            self._cache[v] = (stamps.get(v), manifest)
            out[v] = manifest
        return out

    def _retain(self, keep_count: int) -> None:
        stamps = self.storage.list_manifests()
        versions = sorted(stamps)
        try:
            self._manifests(versions[-keep_count:], stamps)   # warm the cache outside the lock
        except SparkStateError as err:
            log.warning("retention of %s skipped: %s", self.name, err)
            return
        with self._lock:
            stamps = self.storage.list_manifests()
            versions = sorted(stamps)
            if not versions:
                return
            keep, drop = versions[-keep_count:], versions[:-keep_count]
            try:
                kept = self._manifests(keep, stamps)
            except SparkStateError as err:
                log.warning("retention of %s skipped: %s", self.name, err)
                return
            for v in drop:
                self.storage.delete_version(v)
                self._cache.pop(v, None)
            referenced = set(self._pins)
            for manifest in kept.values():
                referenced.update(manifest.paths)
            newest = versions[-1]
            garbage = [p for p in self.storage.list_files()
                       if p not in referenced and (file_version(p) is not None and file_version(p) <= newest)]
            if garbage:
                self.storage.delete_files(garbage)
            if drop or garbage:
                log.info("retention of %s: dropped versions %s, %d file(s)", self.name, drop, len(garbage))


def _entry(path: str, kind: str, version: int, encoded: snapshot.EncodedFile) -> FileEntry:
    return FileEntry(path=path, kind=kind, version=version, size=encoded.size, checksum=encoded.checksum,
                     rows=encoded.rows, index_offset=encoded.index_offset, index_length=encoded.index_length,
                     index_checksum=encoded.index_checksum)


# ----------------------------------------------------------------- cache of stores

_STORES: dict[tuple[str, str], VersionedStore] = {}
_STORES_LOCK = threading.Lock()


def open_store(ref: StoreRef, settings: Settings) -> VersionedStore:
    """The VersionedStore of `ref`, one per (resolved root, storage kind) in this process.

    The root is `ref.location` as an fsspec URL when settings.checkpoint_root
    is None, else checkpoint_root/sha1(spark_root)[:16]/operator/partition/name
    (see spark_state.storage.resolve_root). Memory storage keys its registry by
    the same root. The newest settings win (they come with every request).
    """
    root = resolve_root(ref, settings)
    key = (root, settings.storage)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = VersionedStore(storage_for(ref, settings), settings,
                                   name=f"{root} (operator {ref.operator}, partition {ref.partition}, {ref.name})")
            _STORES[key] = store
        else:
            store.update_settings(settings)
        return store


def forget_stores() -> None:
    """Drops the cached stores (tests; a new worker process starts with none)."""
    with _STORES_LOCK:
        _STORES.clear()
