"""Compaction: folding a long chain into one snapshot, in the background, never rewriting a manifest.

It writes the snapshot and then a compaction record ``chk-N/_snapshot`` beside
manifest N naming it and the commit id it folds (docs/consistency.md, rule
3), so every file a kept manifest names stays referenced. It never brings a
deleted checkpoint back: it re-reads manifest N before writing and again under
the store's lock before its record, and writes with ``recreate=False``
(rule 4). This process then takes a shortcut: later commits whose chain
starts with what it folded build on the snapshot instead (``rebased``), under
the conditions listed there.

A chain of more than ``ranges.RANGE_ROWS`` typed rows is folded a key-group range at a time
(``spark_state.chain.ranges``): the snapshot and its row image are written range by range as they come,
so the worker holds a range's rows, never the partition's state (issue 35). Smaller and opaque (format 1)
chains are folded whole, as before.

Beside the snapshot it writes the snapshot's *row image* (``spark_state.format.rowimage``):
the same rows as Spark's UnsafeRows, which the JVM looks keys up in instead of
loading every row on a restore. A chain is compacted when it is long
(``snapshotInterval`` deltas) or rescaled; and, for a snapshot big enough for a
row image (``rowImages.minRows``), when it has none yet (a store's first
snapshot, written by a commit, which never spends time on an image) or when its
deltas hold half as many rows as it (a restore loads every delta row). A chain
that is nothing but such a snapshot only gets the image. The worker asks after
every commit (``CommitResult.compaction_due``) and queues a due chain's
compaction on its background thread at once; Spark's maintenance asks again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from spark_state.chain.context import StoreContext
from spark_state.chain.merge import merge_chain
from spark_state.chain.ranges import RangeFold, key_group_ranges
from spark_state.chain.reader import ChainReader
from spark_state.chain.retention import MIN_KEPT_VERSIONS, oldest_kept
from spark_state.errors import StateTooLarge, StoreDeleted, VersionNotFound
from spark_state.faults import fault
from spark_state.format import datafile, rowimage, unsaferow
from spark_state.format.manifest import SNAPSHOT, CompactionRecord, FileEntry, ImageEntry, Manifest
from spark_state.format.tables import is_typed
from spark_state.storage.layout import image_path, new_file_path

#: A chain whose deltas hold at least this share of its snapshot's rows is compacted, however short.
DELTA_ROWS_SHARE = 0.5

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
        #: Why this store's rows have no row image (a type without an UnsafeRow encoding here), once seen: a
        #: store's schema does not change, so its snapshots are not read again just to find that out.
        self.no_image: str | None = None

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
        if view.record is not None or not self.due(manifest):
            return
        self.reader.check_parallelism(manifest)
        chain = self.rebased(manifest.files, version, None)   # read less when this process compacted before
        locks = ctx.locks
        with locks.lock:
            locks.pin(f.path for f in chain)
        written: list[str] = []   # files of ours no record names yet
        record_sent = False
        try:
            by_ranges = len(key_group_ranges(chain, ctx.settings.max_parallelism)) > 1 and all(f.typed for f in chain)
            write = self._write_by_ranges if by_ranges else self._write_whole
            entry = write(chain, version, manifest, written)
            if entry is None or not written:
                return
            with locks.lock:
                if not self._still_current(version, manifest):
                    ctx.storage.delete_files(written)
                    return
                record_sent = True   # from here the record may land even if the write raises
                ctx.storage.commit_compaction(version, CompactionRecord(version, manifest.commit_id, entry).to_json())
                # the whole chain, slices of other stores' files included (manifest.paths is this store's files)
                self.shortcut = CompactedPrefix(tuple(f.ident for f in manifest.files), entry, version,
                                                time.monotonic())
                self.blocker = None
            log.info("compacted %s version %d%s: %d deltas -> snapshot of %d rows (%s)%s", ctx.name, version,
                     " a key-group range at a time" if by_ranges else "", manifest.deltas_since_snapshot, entry.rows,
                     "kept" if entry.path not in written else f"{entry.size} bytes",
                     "" if entry.image is None else f", row image of {entry.image.size} bytes")
        except StoreDeleted as err:   # a stopped query's checkpoint deleted by its user: leave it deleted
            ctx.storage.delete_files(written)   # raised before any record was in place
            log.warning("compaction of %s version %d skipped: %s", ctx.name, version, err)
        except BaseException:
            if written and not record_sent:
                ctx.storage.delete_files(written)   # ours, and no record names them
            raise
        finally:
            locks.unpin(f.path for f in chain)

    def _write_whole(self, chain: tuple[FileEntry, ...], version: int, manifest: Manifest,
                     written: list[str]) -> FileEntry | None:
        """The chain's state read whole, then its snapshot (unless the chain is one) and row image written;
        the entry a record names (None: the version is no longer what was compacted)."""
        ctx = self.ctx
        image_only = self._image_only(chain)
        state = self.reader.read(chain[0], None) if image_only else merge_chain(self.reader.read_chain(chain, None))
        if image_only:
            encoded, entry = None, chain[0]
        else:
            encoded = datafile.encode(state, ctx.settings.compression_level, sorted_by_kg=True)
            entry = FileEntry.written(new_file_path(version, SNAPSHOT), SNAPSHOT, version, encoded)
        image = self._image(state)
        if not self._still_current(version, manifest):   # every backend; object stores have no directories
            return None
        if encoded is not None:
            written.append(entry.path)
            ctx.storage.write_file(entry.path, encoded.data, recreate=False)
            fault("compaction-after-snapshot")
        if image is not None:
            entry = replace(entry, image=ImageEntry.written(image_path(entry.path), image))
            written.append(entry.image.path)
            ctx.storage.write_file(entry.image.path, image.data, recreate=False)
        return entry

    def _write_by_ranges(self, chain: tuple[FileEntry, ...], version: int, manifest: Manifest,
                         written: list[str]) -> FileEntry | None:
        """As ``_write_whole``, but the state is folded a key-group range at a time and each range goes into
        the snapshot and the row image as it comes (``spark_state.chain.ranges``): memory for a range, not
        for the partition."""
        ctx = self.ctx
        image_only = self._image_only(chain)
        with RangeFold(self.reader, chain, key_group_ranges(chain, ctx.settings.max_parallelism)) as fold:
            if not self._still_current(version, manifest):
                return None
            outputs: list = []   # open data files, discarded unless closed
            try:
                snapshot = None
                path = chain[0].path if image_only else new_file_path(version, SNAPSHOT)
                if not image_only:
                    written.append(path)
                    outputs.append(ctx.storage.open_data_file(path, recreate=False))
                    snapshot = datafile.StreamEncoder(outputs[-1].write, ctx.settings.compression_level,
                                                      fixed=fold.dictionaries)
                image = None
                if self._wants_image(fold.empty_state().schema, sum(f.rows for f in chain)):
                    written.append(image_path(path))
                    outputs.append(ctx.storage.open_data_file(image_path(path), recreate=False))
                    image = rowimage.ImageWriter(outputs[-1].write)
                for state in fold:
                    if snapshot is not None:
                        snapshot.write(state)
                    if image is not None:
                        image.add(state)
                entry = chain[0]
                if snapshot is not None:
                    entry = self._snapshot_entry(snapshot, outputs[0], path, version, fold)
                    fault("compaction-after-snapshot")
                if image is not None:
                    done = image.finish()
                    outputs[-1].close()
                    entry = replace(entry, image=ImageEntry.written(image_path(path), done))
                return entry if (snapshot is not None or image is not None) else None
            except BaseException:
                for output in outputs:
                    output.discard()
                raise

    def _snapshot_entry(self, snapshot: datafile.StreamEncoder, output, path: str, version: int,
                        fold: RangeFold) -> FileEntry:
        """The written snapshot's entry (a state left empty by its deletes: an empty file of the same schema)."""
        if snapshot.rows:
            done = snapshot.finish()
            output.close()
            return FileEntry.written(path, SNAPSHOT, version, done)
        output.discard()
        encoded = datafile.encode(fold.empty_state(), self.ctx.settings.compression_level)
        self.ctx.storage.write_file(path, encoded.data, recreate=False)
        return FileEntry.written(path, SNAPSHOT, version, encoded)

    def _wants_image(self, schema, estimated_rows: int) -> bool:
        """Whether a snapshot of rows of `schema` written a range at a time gets a row image."""
        if not self._images_on() or self.no_image is not None or estimated_rows < self.ctx.settings.row_images_min_rows:
            return False
        unsupported = [s for s in (unsaferow.supports(schema.field(c).type) for c in ("key", "value")) if not s]
        if unsupported:
            self._no_image(unsupported[0].reason)
            return False
        return True

    def due(self, manifest: Manifest) -> bool:
        """Whether `manifest`'s chain is worth compacting now (see the module docstring); no I/O, so a commit
        asks it of the manifest it wrote and the worker queues the compaction at once."""
        files = manifest.files
        # A rescaled chain (slices of other stores' files) is compacted at once: the new partition gets its
        # own snapshot and, once its older versions age out, other stores' files stop being referenced.
        if manifest.deltas_since_snapshot >= self.ctx.settings.snapshot_interval or any(f.is_slice for f in files):
            return True
        # The rest is about restores that look keys up in a row image and load only the deltas after it.
        base = files[0] if files and files[0].kind == SNAPSHOT else None
        if base is None or not self._images_on() or self.no_image is not None \
                or base.rows < self.ctx.settings.row_images_min_rows:
            return False
        return base.image is None or sum(f.rows for f in files[1:]) >= DELTA_ROWS_SHARE * base.rows

    def _image_only(self, chain: tuple[FileEntry, ...]) -> bool:
        """A chain that is one whole snapshot of this store needs only its image, not a rewrite."""
        return len(chain) == 1 and chain[0].kind == SNAPSHOT and not chain[0].is_slice and chain[0].image is None

    def _images_on(self) -> bool:
        """Row images are for storages whose files the JVM can open (it reads them from local disk)."""
        return self.ctx.settings.row_images and self.ctx.storage.kind == "filesystem"

    def _image(self, state) -> rowimage.EncodedImage | None:
        """The row image of a snapshot's rows, when it should have one and can."""
        if not self._images_on() or state.num_rows < self.ctx.settings.row_images_min_rows:
            return None
        if is_typed(state):
            unsupported = [s for s in (unsaferow.supports(state.schema.field(c).type) for c in ("key", "value"))
                           if not s]
            if unsupported:
                return self._no_image(unsupported[0].reason)
        try:
            return rowimage.encode(state)
        except ValueError as err:   # opaque rows that are not UnsafeRows (hand-made state): no image, no harm
            return self._no_image(str(err))

    def _no_image(self, reason: str) -> None:
        if self.no_image is None:
            self.no_image = reason
            log.info("no row images for %s: %s; its restores load every row", self.ctx.name, reason)
        return None

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
        3. there is a grace period, and the record was written less than a quarter of it ago. Any process
           starts its grace clock for the snapshot no earlier than the snapshot was written, and a commit gives
           up after half the period between reading its base and writing its manifest
           (``Committer._check_deadline``): so the manifest that names the snapshot lands at most 1/4 + 1/2 of
           the period after the snapshot was written, a quarter before any process may delete it
           (docs/consistency.md, rule 4). Without a grace period nothing but condition 2 would protect the
           snapshot, and condition 2 is only this commit's view: another process's retention around a newer
           version may already have dropped the record and deleted the snapshot (found by the multi-process
           model test), so there is no shortcut then.
        """
        shortcut = self.shortcut
        if shortcut is None:
            return chain
        conditions = (
            tuple(f.ident for f in chain[:len(shortcut.folded)]) == shortcut.folded,
            shortcut.version >= oldest_kept(version, keep or MIN_KEPT_VERSIONS),
            self.ctx.settings.file_grace_period > 0
            and time.monotonic() - shortcut.written <= self.ctx.settings.file_grace_period / 4,
        )
        if not all(conditions):
            return chain
        return (shortcut.snapshot,) + chain[len(shortcut.folded):]
