"""VersionedStore: the versions of one Spark state store in one checkpoint storage.

A version is a chain: a full snapshot (or nothing) followed by deltas, one per
commit since. ``commit`` is on Spark's critical path, so it writes exactly one
data file (the delta) and one manifest. ``maintenance`` (a background thread
in the worker) folds long chains into a snapshot and deletes what no retained
version needs.

Several processes touch one store (executors come and go, task attempts are
retried and speculated), so nothing here trusts memory over storage
(docs/consistency.md has the argument in full):

* **Identity.** Every manifest carries a ``commit_id`` (its content's identity)
  and the ``query_id`` of its timeline. A commit reads version-1's manifest
  fresh and builds on it only if it is the one the caller loaded
  (``base_commit_id``), else ``StaleState`` (``commit.py``).
* **Manifests are immutable** but for a re-commit of the same version.
  Compaction writes a *record* (``chk-N/_snapshot``) beside manifest N instead
  of rewriting it, so whatever a kept manifest names stays referenced
  (``compaction.py``).
* **Deletion** (retention, in any process) removes a data file only when
  (a) nothing names it, (b) it was written for a version below the retained
  window, and (c) this process has seen it unreferenced for
  ``file_grace_period`` (``retention.py``). ``abort`` deletes only what this
  process wrote. After a rescale, files that other partitions' manifests name
  count as referenced while a live reference record says so
  (``references.py``, rule 6).

This class only wires the parts together and keeps the public API the worker,
the tools and the tests use. Within one process they share ``StoreContext``:
a per-store lock serialises commits and deletions; loads and compactions pin
the files they read.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import pyarrow as pa

from spark_state.chain.commit import UNCHECKED, CommitResult, Committer
from spark_state.chain.compaction import Compactor
from spark_state.chain.context import StoreContext
from spark_state.chain.history import History
from spark_state.chain.reader import ChainReader, Loaded
from spark_state.chain.retention import Retention
from spark_state.chain.staging import StagedCommit
from spark_state.options import Settings
from spark_state.storage.base import CheckpointStorage

log = logging.getLogger(__name__)

#: A maintenance run still going after this long is logged by the runs it makes skip.
_LONG_MAINTENANCE_S = 120.0

__all__ = ["CommitResult", "Loaded", "UNCHECKED", "VersionedStore"]


class VersionedStore:
    """The versions of one store in one checkpoint storage (see the module docstring)."""

    def __init__(self, storage: CheckpointStorage, settings: Settings, name: str | None = None,
                 query_id: str | None = None, *, partition: int | None = None,
                 siblings: Callable[[int], CheckpointStorage] | None = None):
        self.ctx = StoreContext(storage, settings, name or storage.root, query_id)
        self.reader = ChainReader(self.ctx, partition, siblings)
        self.compactor = Compactor(self.ctx, self.reader)
        self.committer = Committer(self.ctx, self.reader, self.compactor)
        self.retention = Retention(self.ctx, self.reader)
        self.history = History(self.reader)
        self.maintenance_failures = 0              # consecutive failed maintenance runs
        self.maintenance_error: str | None = None
        self.last_used = time.monotonic()
        self._maintenance_started = 0.0            # monotonic start of the running (or last) maintenance

    @property
    def storage(self) -> CheckpointStorage:
        return self.ctx.storage

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self.ctx.settings = settings

    @property
    def name(self) -> str:
        return self.ctx.name

    @property
    def query_id(self) -> str | None:
        return self.ctx.query_id

    def __repr__(self) -> str:
        return f"VersionedStore({self.name!r}, {self.storage.kind})"

    def update_settings(self, settings: Settings) -> None:
        """The settings of the latest request (they come with every request)."""
        if settings.memory_max_state_size != self.ctx.settings.memory_max_state_size:
            self.compactor.blocker = None   # a raised limit deserves another compaction attempt
        self.ctx.settings = settings
        if hasattr(self.storage, "max_state_size"):
            self.storage.max_state_size = settings.memory_max_state_size

    def busy(self) -> bool:
        """True while anything of this process is using the store (it must not be evicted)."""
        return self.ctx.locks.busy()

    # ------------------------------------------------------------- the worker's operations

    def commit(self, version: int, changes: pa.Table, base_commit_id=UNCHECKED,
               min_versions_to_retain: int | None = None, *, full: bool = False,
               repeated_keys: bool = False, staged: StagedCommit | None = None,
               keys: int | None = None, lineage: bool = False) -> CommitResult:
        """Makes `version` = version-1 + changes durable; replaces an existing `version` (a retried batch).

        ``base_commit_id`` is the identity of version-1 the caller built its
        changes on (None for version 0); storage must still hold exactly that,
        else ``StaleState``. ``min_versions_to_retain`` bounds how far back a
        compacted snapshot may be reused (``Compactor.rebased``). ``full``: the
        changes are the whole state (a shim switching file formats).
        ``repeated_keys``: a key may appear more than once; its last row wins.
        ``staged``: the changes streamed before (``stage``); `changes` are the rest.
        ``keys``: how many keys the state at `version` holds, when the caller counted them (the manifest
        records it; a snapshot's count must match its rows).
        ``lineage`` (Spark's checkpoint format v2): the commit builds on the commit ``base_commit_id`` of
        version-1 even when another commit of it was written since (a concurrent attempt of the batch), and
        stays loadable by its own commit id (``load_checked(..., lineage=)``) whatever is committed as
        `version` after it: the manifest is also written as ``chk-N/_metadata-<commit id>``.
        """
        return self.committer.commit(version, changes, base_commit_id, min_versions_to_retain, full=full,
                                     repeated_keys=repeated_keys, staged=staged, keys=keys, lineage=lineage)

    def stage(self, version: int, full: bool = False) -> StagedCommit:
        """A commit of `version` whose changes come in chunks while its batch runs (``StagedCommit.append``),
        or whose whole state does (`full`), completed by ``commit(..., staged=)``; nothing is visible before
        that."""
        return self.committer.stage(version, full)

    def abort(self, version: int) -> None:
        """Removes files this process wrote for `version` that no manifest names.

        Never a file merely unreferenced: another executor's commit of the same
        version may be writing it right now; retention collects real orphans.
        """
        self.committer.abort(version)

    def load(self, version: int, key_groups=None, *, ordered: bool = True) -> pa.Table:
        """The full state at `version` (or only `key_groups`), without deletes; sorted by key group
        unless ``ordered=False`` (a restore into a hash map does not need the order)."""
        return self.reader.load_checked(version, key_groups=key_groups, ordered=ordered).table

    def load_checked(self, version: int, known_commit_id: str | None = None, *, key_groups=None,
                     ordered: bool = True, lineage: str | None = None) -> Loaded:
        """`version` with its commit id, read fresh from storage; no rows when it is still `known_commit_id`.
        `lineage`: the commit of `version` to load (a checkpoint id of format v2), else the latest one."""
        return self.reader.load_checked(version, known_commit_id, key_groups=key_groups, ordered=ordered,
                                        lineage=lineage)

    def load_lazy(self, version: int, known_commit_id: str | None = None, *, cache_dir: str,
                  ranges: bool = False, lineage: str | None = None, defer: bool = False) -> Loaded:
        """`version` for a reader that looks keys up in row images: the image and the changes after it when the
        chain has one, else every row (``ChainReader.load_lazy``; ``ranges``: the reader fetches a remote image's
        blocks by byte range; ``defer``: a remote image's changes may come after it, in ``Loaded.deferred``;
        ``lineage``: the commit of `version` to load, as ``load_checked``)."""
        return self.reader.load_lazy(version, known_commit_id, cache_dir=cache_dir, ranges=ranges, lineage=lineage,
                                     defer=defer)

    def versions(self) -> list[int]:
        return self.reader.versions()

    def latest_version(self) -> int | None:
        return self.reader.latest_version()

    def compact(self, version: int | None = None) -> None:
        """Compaction alone, around `version` (a commit left its chain due): under maintenance's rules, one
        run per store at a time (a concurrent call returns at once), a failure counted and logged as
        maintenance's are."""
        lock = self.ctx.locks.maintenance
        if not lock.acquire(blocking=False):
            return
        self._maintenance_started = time.monotonic()
        try:
            self.compactor.compact(version)
        except Exception as err:  # noqa: BLE001 - counted, reported with every commit, retried by maintenance
            self._failed([err])
        finally:
            lock.release()

    def _failed(self, errors: list[Exception]) -> None:
        self.maintenance_failures += 1
        self.maintenance_error = "; ".join(f"{type(e).__name__}: {e}" for e in errors)
        log.warning("maintenance of %s failed (%d in a row): %s", self.name, self.maintenance_failures,
                    self.maintenance_error)

    def maintenance(self, min_versions_to_retain: int, version: int | None = None) -> None:
        """Compaction, then retention, around `version` (the version the caller holds; default the newest).

        Retention runs even when compaction fails; a failure is counted in
        ``maintenance_failures`` / ``maintenance_error`` (reported with every
        commit) and logged. One run per store at a time; a concurrent call returns at once.
        """
        lock = self.ctx.locks.maintenance
        if not lock.acquire(blocking=False):
            running = time.monotonic() - self._maintenance_started
            if running > _LONG_MAINTENANCE_S:
                log.warning("maintenance of %s has been running for %.0fs; this run is skipped", self.name, running)
            return
        self._maintenance_started = time.monotonic()
        try:
            errors = []
            try:
                self.compactor.compact(version)
            except Exception as err:  # noqa: BLE001 - retention must still run
                errors.append(err)
            try:
                self.retention.retain(max(1, int(min_versions_to_retain)), version)
            except Exception as err:  # noqa: BLE001
                errors.append(err)
            if errors:
                self._failed(errors)
            else:
                self.maintenance_failures, self.maintenance_error = 0, None
        finally:
            lock.release()
