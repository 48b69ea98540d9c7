"""What every part of one store shares inside this process, made explicit.

Commit, load, compaction and retention of a store each live in their own
module; this is all they share: where the store is (its storage), how it is
configured (settings, replaced as requests bring new ones), which timeline it
serves (query id), and this process's locks and pins. Nothing else passes
between them except through storage (docs/consistency.md: storage is the only
shared truth across processes).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Iterable

from spark_state.options import Settings
from spark_state.storage.base import CheckpointStorage


class StoreLocks:
    """This process's locks and pins of one store.

    ``lock`` serialises what changes storage here: commits, abort, the
    compaction record write and retention's deletions; loads and compactions
    hold it only while they pin the files they will read. ``pins`` counts
    those files: retention never deletes a pinned file. ``maintenance`` lets
    one compaction + retention run at a time. ``queued`` counts the worker's
    background jobs of the store that have not run yet (they hold this store).
    """

    def __init__(self):
        self.lock = threading.RLock()
        self.maintenance = threading.Lock()
        self._pins: collections.Counter[str] = collections.Counter()
        self._queued = 0
        self._queued_lock = threading.Lock()

    def queued(self, delta: int) -> None:
        """A background job of the store was queued (+1) or has run, or was never queued after all (-1)."""
        with self._queued_lock:
            self._queued += delta

    def pin(self, paths: Iterable[str]) -> None:
        """Marks files as being read (call with ``lock`` held, together with reading what names them)."""
        self._pins.update(paths)

    def unpin(self, paths: Iterable[str]) -> None:
        with self.lock:
            self._pins.subtract(paths)
            self._pins += collections.Counter()   # drops zero counts

    def pinned(self) -> set[str]:
        """Files some load or compaction of this process is reading (call with ``lock`` held)."""
        return set(self._pins)

    def busy(self) -> bool:
        """True while anything of this process is using the store (it must not be evicted)."""
        if self._pins or self._queued or self.maintenance.locked():
            return True
        if not self.lock.acquire(blocking=False):
            return True
        self.lock.release()
        return False


@dataclass(eq=False)
class StoreContext:
    """One store as each of its parts sees it."""

    storage: CheckpointStorage
    settings: Settings
    name: str
    query_id: str | None = None
    locks: StoreLocks = field(default_factory=StoreLocks)
