"""A store's history: the changes each version's commit made, read back from its chain.

Spark's change feed, snapshot replay and ``read_changes`` all read this. A
commit writes exactly one data file for its version (``commit.py``): a delta
with that batch's changes, one row per key (its last write in the batch; a
null value is a delete), or for version 1, which builds on the empty state, a
snapshot whose rows are all that batch's puts. Nothing rewrites that file:
compaction writes a new snapshot *beside* the manifests (docs/consistency.md,
rule 3). So the changes of version v can be read as long as a retained
manifest names the file v's commit wrote: manifest v itself (its last entry)
or, after retention dropped manifest v, the chain of a later manifest that
still builds on that delta (until a compaction's snapshot replaces it).

What cannot be read is said, never skipped: versions retention dropped
(``minBatchesToRetain``), and versions written whole instead of as changes (a
rescale's slices, a migration or restore, a shim switching file formats)
raise ``HistoryUnavailable`` naming the batches.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from spark_state.chain.merge import merge_chain
from spark_state.chain.reader import ChainReader
from spark_state.errors import HistoryUnavailable
from spark_state.format.manifest import DELTA, SNAPSHOT, FileEntry
from spark_state.storage.layout import format_versions

_DROPPED = "dropped"
_WHOLE = "whole"


def _changes_of(entry: FileEntry | None, version: int) -> bool:
    """Whether `entry` is the file `version`'s commit wrote as that batch's changes."""
    if entry is None or entry.version != version or entry.is_slice:
        return False
    return entry.kind == DELTA or (entry.kind == SNAPSHOT and version == 1)


def _batches(versions: list[int]) -> str:
    return format_versions([v - 1 for v in versions])


class History:
    """The recorded changes of one store's versions (see the module docstring)."""

    def __init__(self, reader: ChainReader):
        self.reader = reader

    def recorded(self, start: int, end: int) -> list[FileEntry]:
        """The file holding each version's changes, `start`..`end` (versions, = batch + 1), oldest first.

        Raises HistoryUnavailable when any of them has none (no partial history), VersionNotFound when `end`
        was never committed."""
        if start < 1 or end < start:
            raise HistoryUnavailable(f"no history of {self.reader.ctx.name} from version {start} to {end}: "
                                     f"versions start at 1 (batch 0) and the range must not be empty.")
        versions = self.reader.versions()
        if not versions or end > versions[-1]:
            raise self.reader.ctx.storage.version_not_found(end)
        present = set(versions)
        found: dict[int, FileEntry] = {}
        missing: dict[int, str] = {}
        older: dict[int, FileEntry] | None = None   # deltas the earliest retained chain still names
        for v in range(start, end + 1):
            if v in present:
                files = self.reader.read_manifest(v).files
                entry = files[-1] if files else None
                if _changes_of(entry, v):
                    found[v] = entry
                else:
                    missing[v] = _WHOLE
                continue
            if older is None:
                later = min((p for p in versions if p > v), default=None)
                chain = self.reader.read_manifest(later).files if later is not None else ()
                older = {f.version: f for f in chain if _changes_of(f, f.version)}
            if v in older:
                found[v] = older[v]
            else:
                missing[v] = _DROPPED
        if missing:
            raise HistoryUnavailable(self._explain(start, end, missing))
        return [found[v] for v in range(start, end + 1)]

    def _explain(self, start: int, end: int, missing: dict[int, str]) -> str:
        name = self.reader.ctx.name
        dropped = sorted(v for v, why in missing.items() if why == _DROPPED)
        whole = sorted(v for v, why in missing.items() if why == _WHOLE)
        parts = [f"the changes of batches {_batches(sorted(missing))} of state store {name} are not in the "
                 f"checkpoint, so its history from batch {start - 1} to {end - 1} cannot be given whole"]
        if dropped:
            parts.append(f"batches {_batches(dropped)} are older than retention keeps: Spark keeps the last "
                         f"spark.sql.streaming.minBatchesToRetain batches (default 100; spark_state keeps at least "
                         f"2), and compaction has folded older changes into snapshots. Raise minBatchesToRetain "
                         f"to keep more history")
        if whole:
            parts.append(f"batches {_batches(whole)} were written as a whole state, not as changes (a rescale, a "
                         f"migration or restore, or a shim switching file formats starts a store's history anew)")
        complete_from = max(missing) + 1
        if complete_from <= end:
            parts.append(f"the history is complete from batch {complete_from - 1} on")
        return "; ".join(parts) + "."

    def changes(self, start: int, end: int) -> Iterator[tuple[int, pa.Table]]:
        """(version, its changes) for `start`..`end`, oldest first: rows ``kg, hash, key, value`` (null value =
        delete), one per key the batch wrote, in the order the batch last wrote them. Checks the whole range
        before the first table, so a caller never gets part of a history it cannot finish."""
        entries = self.recorded(start, end)
        for version, entry in zip(range(start, end + 1), entries):
            yield version, self._read(entry)

    def replay(self, snapshot_version: int, end: int) -> pa.Table:
        """The state at `end`, rebuilt from the state at `snapshot_version` and the changes recorded after it
        (Spark's snapshot replay); the result equals ``load(end)`` but reads another path through the files."""
        if end < snapshot_version:
            raise HistoryUnavailable(f"cannot replay {self.reader.ctx.name} from batch {snapshot_version - 1} to "
                                     f"the earlier batch {end - 1}.")
        changes = [t for _, t in self.changes(snapshot_version + 1, end)] if end > snapshot_version else []
        base = self.reader.load_checked(snapshot_version, ordered=False).table
        return merge_chain([base, *changes], ordered=False) if changes else base

    def _read(self, entry: FileEntry) -> pa.Table:
        locks = self.reader.ctx.locks
        with locks.lock:
            locks.pin([entry.path])
        try:
            return self.reader.read(entry, None)
        finally:
            locks.unpin([entry.path])
