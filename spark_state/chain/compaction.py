"""Compaction: folding a long chain into one snapshot, in the background, never rewriting a manifest.

It writes the snapshot and then a compaction record ``chk-N/_snapshot`` beside
manifest N naming it and the commit id it folds (docs/consistency.md, rule
3), so every file a kept manifest names stays referenced. It never brings a
deleted checkpoint back: it re-reads manifest N before writing and again under
the store's lock before its record, and writes with ``recreate=False``
(rule 4). This process then takes a shortcut: later commits whose chain
starts with what it folded build on the snapshot instead (``rebased``), under
the conditions listed there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from spark_state.chain.context import StoreContext
from spark_state.chain.merge import merge_chain
from spark_state.chain.reader import ChainReader
from spark_state.chain.retention import MIN_KEPT_VERSIONS, oldest_kept
from spark_state.errors import StateTooLarge, StoreDeleted, VersionNotFound
from spark_state.faults import fault
from spark_state.format import datafile
from spark_state.format.manifest import SNAPSHOT, CompactionRecord, FileEntry, Manifest
from spark_state.storage.layout import new_file_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactedPrefix:
    """This process's latest compaction: the chain it folded and the snapshot that now stands for it."""

    folded: tuple[tuple, ...]   # FileEntry.ident of each folded entry (slices of other stores' files included)
    snapshot: FileEntry
    version: int                # the version compacted (its record names the snapshot)
    written: float              # time.monotonic() when its record was written


class Compactor:
    """Compaction of one store in this process (see the module docstring)."""

    def __init__(self, ctx: StoreContext, reader: ChainReader):
        self.ctx = ctx
        self.reader = reader
        self.shortcut: CompactedPrefix | None = None
        #: The compaction failure that blocks commits (StateTooLarge of memory storage: a commit would only
        #: grow the chain that cannot be compacted); cleared by a compaction that works or a raised limit.
        self.blocker: StateTooLarge | None = None

    def compact(self, version: int | None) -> None:
        """Folds `version`'s chain (default: the newest) into a snapshot when it is long enough or rescaled."""
        try:
            self._compact(version)
        except StateTooLarge as err:
            self.blocker = err
            raise

    def _compact(self, version: int | None) -> None:
        ctx = self.ctx
        if version is None:
            version = self.reader.latest_version()
        if not version:
            return
        try:
            view = self.reader.view(version)
        except VersionNotFound:
            return
        manifest = view.manifest
        # A rescaled chain (slices of other stores' files) is compacted at once: the new partition gets its
        # own snapshot and, once its older versions age out, other stores' files stop being referenced.
        if view.record is not None or (manifest.deltas_since_snapshot < ctx.settings.snapshot_interval
                                       and not any(f.is_slice for f in manifest.files)):
            return
        self.reader.check_parallelism(manifest)
        chain = self.rebased(manifest.files, version, None)   # read less when this process compacted before
        locks = ctx.locks
        with locks.lock:
            locks.pin(f.path for f in chain)
        path, record_sent = None, False
        try:
            state = merge_chain([self.reader.read(entry, None) for entry in chain])
            encoded = datafile.encode(state, ctx.settings.compression_level, sorted_by_kg=True)
            if not self._still_current(version, manifest):   # every backend; object stores have no directories
                return
            path = new_file_path(version, SNAPSHOT)
            ctx.storage.write_file(path, encoded.data, recreate=False)
            fault("compaction-after-snapshot")
            entry = FileEntry.written(path, SNAPSHOT, version, encoded)
            with locks.lock:
                if not self._still_current(version, manifest):
                    ctx.storage.delete_files([path])
                    return
                record_sent = True   # from here the record may land even if the write raises
                ctx.storage.commit_compaction(version, CompactionRecord(version, manifest.commit_id, entry).to_json())
                # the whole chain, slices of other stores' files included (manifest.paths is this store's files)
                self.shortcut = CompactedPrefix(tuple(f.ident for f in manifest.files), entry, version,
                                                time.monotonic())
                self.blocker = None
            log.info("compacted %s version %d: %d deltas -> snapshot of %d rows (%d bytes)", ctx.name, version,
                     manifest.deltas_since_snapshot, encoded.rows, encoded.size)
        except StoreDeleted as err:   # a stopped query's checkpoint deleted by its user: leave it deleted
            if path is not None:
                ctx.storage.delete_files([path])   # raised before any record was in place
            log.warning("compaction of %s version %d skipped: %s", ctx.name, version, err)
        except BaseException:
            if path is not None and not record_sent:
                ctx.storage.delete_files([path])   # ours, and no record names it
            raise
        finally:
            locks.unpin(f.path for f in chain)

    def _still_current(self, version: int, manifest: Manifest) -> bool:
        """Whether storage still holds `manifest` as version N; a compaction of anything else is dropped quietly."""
        try:
            current = self.reader.read_manifest(version)
        except VersionNotFound:
            log.info("compaction of %s version %d skipped: the version is gone (retention, or the checkpoint was "
                     "deleted)", self.ctx.name, version)
            return False
        if current.commit_id != manifest.commit_id:
            log.info("compaction of %s version %d skipped: the version was re-committed meanwhile", self.ctx.name,
                     version)
            return False
        return True

    def rebased(self, chain: tuple[FileEntry, ...], version: int, keep: int | None) -> tuple[FileEntry, ...]:
        """`chain` (for a commit or compaction of `version`) with the prefix this process compacted replaced by
        its snapshot, when every condition holds:

        1. the chain starts with exactly what the snapshot folded (the same files, the same slices);
        2. the compacted version is inside the window that every process keeps while `version` is being
           committed (``oldest_kept(version, keep)``): its record, which names the snapshot until the new
           manifest does, is not dropped by retention anywhere;
        3. with a grace period, the record was written less than a quarter of it ago. Any process starts its
           grace clock for the snapshot no earlier than the snapshot was written, and a commit gives up after
           half the period between reading its base and writing its manifest (``Committer._check_deadline``):
           so the manifest that names the snapshot lands at most 1/4 + 1/2 of the period after the snapshot
           was written, a quarter before any process may delete it (docs/consistency.md, rule 4).
        """
        shortcut = self.shortcut
        if shortcut is None:
            return chain
        conditions = (
            tuple(f.ident for f in chain[:len(shortcut.folded)]) == shortcut.folded,
            shortcut.version >= oldest_kept(version, keep or MIN_KEPT_VERSIONS),
            self.ctx.settings.file_grace_period <= 0
            or time.monotonic() - shortcut.written <= self.ctx.settings.file_grace_period / 4,
        )
        if not all(conditions):
            return chain
        return (shortcut.snapshot,) + chain[len(shortcut.folded):]
