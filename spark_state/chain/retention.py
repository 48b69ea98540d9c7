"""Retention: dropping versions below the window and deleting files nothing may still read.

docs/consistency.md, rule 4. Around the version ``c`` the caller holds, keeping
``k = max(minBatchesToRetain, MIN_KEPT_VERSIONS)`` versions, retention deletes
manifests below ``c - k + 1`` and a data file only when

1. nothing names it: no present manifest or compaction record, no live
   reference record of another store (rule 6), no load or compaction of this
   process (pins) -- ``ReferenceSet``;
2. it was written for a version below the window (from its name) -- ``ReferenceSet.orphans``;
3. this process has seen it unreferenced for ``fileGracePeriod`` across
   consecutive runs -- ``GraceClock``.

It applies the window only while storage's version ``c`` is this store's
timeline (``owns_timeline``), so a stopped query's late maintenance never drops
a newer timeline's versions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable

from spark_state.chain.context import StoreContext
from spark_state.chain.reader import ChainReader
from spark_state.chain.references import referenced_elsewhere
from spark_state.format.manifest import CompactionRecord, Manifest
from spark_state.storage.layout import COMPACTION_NAME, file_version, lineage_name, record_path

log = logging.getLogger(__name__)

#: Versions retention always keeps, whatever minBatchesToRetain says: a commit in flight builds on
#: the newest, and a duplicate attempt of it on the one before.
MIN_KEPT_VERSIONS = 2
#: Manifests kept in memory per store (retention re-reads only those whose listing stamp changed).
_CACHE_LIMIT = 1024


def oldest_kept(current: int, keep: int) -> int:
    """The oldest version of the window around `current` when `keep` versions are to be retained."""
    return current - max(keep, MIN_KEPT_VERSIONS) + 1


@dataclass(frozen=True)
class ReferenceSet:
    """Every file of this store that something may still read (condition 1)."""

    paths: frozenset[str]
    #: False when a reference record of another store could not be judged: then no file may be deleted
    complete: bool = True

    @classmethod
    def gather(cls, manifests: Iterable[Manifest], records: Iterable[CompactionRecord], pinned: set[str],
               elsewhere: set[str] | None) -> "ReferenceSet":
        paths = set(pinned) | (elsewhere or set())
        for manifest in manifests:
            paths.update(manifest.paths)
        paths.update(p for r in records for p in r.snapshot.paths)   # a snapshot and its row image
        return cls(frozenset(paths), elsewhere is not None)

    def orphans(self, files: Iterable[str], oldest: int) -> list[str]:
        """Files no reference names that were written for a version below the window (conditions 1 and 2)."""
        if not self.complete:
            return []
        return [p for p in files
                if p not in self.paths and (written := file_version(p)) is not None and written < oldest]


class GraceClock:
    """Since when this process has seen each orphan unreferenced, in consecutive runs (condition 3)."""

    def __init__(self):
        self._since: dict[str, float] = {}

    def due(self, orphans: list[str], grace: float, now: float) -> list[str]:
        """Orphans seen unreferenced for `grace` seconds; a file referenced again (absent here) starts over."""
        self._since = {p: self._since.get(p, now) for p in orphans}
        return [p for p, since in self._since.items() if now - since >= grace]

    def fresh(self, orphans: list[str]) -> list[str]:
        """The orphans this clock does not time yet."""
        return [p for p in orphans if p not in self._since]

    def forget(self, paths: Iterable[str]) -> None:
        for p in paths:
            del self._since[p]


class Retention:
    """Retention of one store in this process (see the module docstring)."""

    def __init__(self, ctx: StoreContext, reader: ChainReader):
        self.ctx = ctx
        self.reader = reader
        self.clock = GraceClock()
        self._cache: dict[int, tuple[str | None, Manifest]] = {}   # version -> (listing stamp, manifest)
        self._lineage_cache: dict[tuple[int, str], tuple[str, Manifest]] = {}   # (version, commit id) -> (stamp, ..)

    def retain(self, keep: int, version: int | None) -> None:
        """Drops versions below the window around `version` (default: the newest) and deletes orphans."""
        ctx = self.ctx
        storage = ctx.storage
        stamps = storage.list_manifests()
        if not stamps:
            return
        current = version if version is not None else max(stamps)
        oldest = oldest_kept(current, keep)
        self._manifests([v for v in stamps if v >= oldest], stamps)   # warm the cache outside the lock
        # Files other stores' manifests name (after a rescale, see spark_state.chain.references): they are
        # referenced like our own manifests' files. None: a reference record could not be judged.
        elsewhere: set[str] | None = set()
        if self.reader.siblings is not None and self.reader.partition is not None:
            elsewhere = referenced_elsewhere(storage, self.reader.partition, self.reader.sibling)
        with ctx.locks.lock:
            stamps = storage.list_manifests()
            drop = sorted(v for v in stamps if v < oldest)
            kept = sorted(v for v in stamps if v >= oldest)
            manifests = self._manifests(kept, stamps)
            if not self.owns_timeline(current, manifests):
                return
            records = self._records(storage.list_records(COMPACTION_NAME).keys() - set(drop))
            lineages = self._lineages(oldest)
            for v in drop:
                storage.delete_version(v)
                self._cache.pop(v, None)
            references = ReferenceSet.gather([*manifests.values(), *lineages], records, ctx.locks.pinned(), elsewhere)
            orphans = references.orphans(storage.list_files(), oldest)
            fresh = self.clock.fresh(orphans)
            due = self.clock.due(orphans, ctx.settings.file_grace_period, time.monotonic())
            if fresh:   # the start of a file's grace period: with the deletion below, the log shows both ends
                log.info("retention of %s around version %d: %d file(s) below the window (from %d) are "
                         "unreferenced; deleted once unreferenced for %gs: %s", ctx.name, current, len(fresh),
                         oldest, ctx.settings.file_grace_period, _some(fresh))
            if due:
                storage.delete_files(due)
                self.clock.forget(due)
            if drop or due:
                log.info("retention of %s: dropped versions %s, %d file(s)", ctx.name, drop, len(due))

    def owns_timeline(self, version: int, manifests: dict[int, Manifest]) -> bool:
        """Whether storage's `version` is this store's timeline, so a window around it is ours to apply.

        Spark can run maintenance on a stopped query's provider before it unloads it; if that
        query's checkpoint was deleted and the query started again at the same path, its old version
        is gone or belongs to the new query id, and its window would drop the new timeline's versions.
        """
        manifest = manifests.get(version)
        query_id = self.ctx.query_id
        if manifest is None or (query_id and manifest.query_id and manifest.query_id != query_id):
            log.info("retention of %s skipped: version %d in storage is not query %s's (a newer timeline or "
                     "retention elsewhere replaced it)", self.ctx.name, version, query_id)
            return False
        return True

    def _manifests(self, versions: list[int], stamps: dict[int, str]) -> dict[int, Manifest]:
        """Manifests of `versions`, re-read only where the listing stamp changed since they were cached."""
        out = {}
        for v in versions:
            cached = self._cache.get(v)
            if cached is not None and cached[0] is not None and cached[0] == stamps.get(v):
                out[v] = cached[1]
                continue
            manifest = self.reader.read_manifest(v)
            self._cache[v] = (stamps.get(v), manifest)
            if len(self._cache) > _CACHE_LIMIT:   # dropped versions leave it; bound it anyway
                for old in sorted(self._cache)[:len(self._cache) - _CACHE_LIMIT]:
                    del self._cache[old]
            out[v] = manifest
        return out

    def _lineages(self, oldest: int) -> list[Manifest]:
        """The lineage manifests (checkpoint format v2: every attempt's commit of a version, by its id) of the
        versions from `oldest` on: a kept version's every commit may still be the one Spark loads, so the files
        they name are referenced (docs/consistency.md, rule 7). Re-read only where the listing stamp changed."""
        out = []
        found = self.ctx.storage.list_lineages()
        for key in list(self._lineage_cache):
            if key not in found:
                del self._lineage_cache[key]
        for (version, commit_id), stamp in found.items():
            if version < oldest:
                continue
            cached = self._lineage_cache.get((version, commit_id))
            if cached is None or cached[0] != stamp:
                data = self.ctx.storage.read_lineage(version, commit_id)
                if data is None:   # its version was dropped meanwhile
                    continue
                name = f"{self.ctx.storage.root}/{record_path(version, lineage_name(commit_id))}"
                cached = (stamp, Manifest.from_json(data, name))
                self._lineage_cache[(version, commit_id)] = cached
            out.append(cached[1])
        return out

    def _records(self, versions: Iterable[int]) -> list[CompactionRecord]:
        storage = self.ctx.storage
        out = []
        for v in versions:
            data = storage.read_record(v, COMPACTION_NAME)
            if data is not None:
                out.append(CompactionRecord.from_json(data, f"{storage.root}/{record_path(v, COMPACTION_NAME)}"))
        return out


def _some(paths: list[str], shown: int = 10) -> str:
    """The first `shown` of `paths` for a log line, and how many more."""
    names = sorted(paths)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
