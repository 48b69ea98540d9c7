"""The pool that remote reads run on: requests to storage made at once, one thread each while it waits."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

#: Requests of one process to storage at once: a load waits about one round trip per this many files or
#: ranges, and a stalled request holds up one of them.
READ_AHEAD = 8
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def read_pool() -> ThreadPoolExecutor:
    """One pool for the process, made on first use. Its jobs only wait on storage and never on the pool
    itself (a job that submits to it and waits could deadlock it)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="spark-state-read")
        return _pool
