"""Changes of lazy loads still being read, by token, until the shim asks for them (docs/protocol.md,
"Row images on remote storage").

A deferred load answers with the image as soon as its manifest is read and reads the changes after the
image in the background; the shim's ``changesAfterImage`` takes them here. A token lives in this process
only: a new worker has none, and reads the changes again from what the request names. Changes nobody takes
(the store was closed before its first read) are dropped after ``IDLE_LIMIT``.
"""

from __future__ import annotations

import secrets
import threading
import time

from spark_state.chain.reader import DeferredChanges

#: Changes not taken for this long are dropped: a shim asks for them right after the load, or never.
IDLE_LIMIT = 5 * 60.0


class DeferredRegistry:
    """Deferred changes by token; each is taken once."""

    def __init__(self, idle_limit: float = IDLE_LIMIT):
        self._pending: dict[str, tuple[float, DeferredChanges]] = {}
        self._lock = threading.Lock()
        self.idle_limit = idle_limit

    def put(self, deferred: DeferredChanges) -> str:
        """A token for `deferred` (unguessable: another store's request cannot take them by accident)."""
        token = secrets.token_hex(16)
        with self._lock:
            self._expire()
            self._pending[token] = (time.monotonic(), deferred)
        return token

    def take(self, token: str) -> DeferredChanges | None:
        """The changes of `token`, once; None when this process has none (a new worker, or dropped)."""
        with self._lock:
            self._expire()
            entry = self._pending.pop(token, None)
        return None if entry is None else entry[1]

    def sweep(self) -> None:
        """Drops what waited too long (the dispatcher calls it at every request: a quiet worker keeps nothing)."""
        if self._pending:
            with self._lock:
                self._expire()

    def _expire(self) -> None:
        """Drops changes not taken within ``idle_limit`` (call with the lock held)."""
        now = time.monotonic()
        for old in [t for t, (at, _) in self._pending.items() if now - at > self.idle_limit]:
            del self._pending[old]   # not cancelled: the read, once done, unpins its files itself

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)
