"""The worker's background work: maintenance and compaction of stores, off every request's thread.

One thread runs every job, one at a time, so heavy work (a compaction reads a chain and writes a snapshot
and its row image) never sits inside a commit or a load, and two jobs never compete for memory. A job is
queued under a key (what it does, to which store): while a job of that key waits to start, queuing it
again only hands it the newer argument (a newer version to compact), so a store never has two waiting.
``drain`` lets the executor's shutdown wait for what is queued (docs/protocol.md, ``drain``): a query
stopped right after a large batch still gets the row images its restart will read.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

import pyarrow as pa

log = logging.getLogger("spark_state.worker")

#: A job longer than this is logged (with its key): one thread serves every store, so it delays the others.
SLOW_JOB_S = 10.0


class BackgroundWork:
    """Jobs by key on one thread (see the module docstring)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-state-maintenance")
        self._changed = threading.Condition()
        self._waiting: dict[Hashable, object] = {}   # key of a job not yet started -> the argument it will run with
        self._jobs = 0                                 # queued or running

    def submit(self, key: Hashable, job: Callable[[object], None], argument: object,
               merge: Callable[[object, object], object] = lambda old, new: new) -> bool:
        """Queues ``job(argument)`` under `key`; True. When a job of `key` is waiting already, it gets
        ``merge(its argument, argument)`` instead and nothing is queued: False."""
        with self._changed:
            if key in self._waiting:
                self._waiting[key] = merge(self._waiting[key], argument)
                return False
            self._waiting[key] = argument
            self._jobs += 1
        try:
            self._pool.submit(self._run, key, job)
        except RuntimeError:   # shut down: the worker is exiting
            with self._changed:
                self._waiting.pop(key, None)
                self._jobs -= 1
                self._changed.notify_all()
            raise
        return True

    def _run(self, key: Hashable, job: Callable[[object], None]) -> None:
        started = time.monotonic()
        try:
            with self._changed:
                argument = self._waiting.pop(key)
            job(argument)
        except Exception:  # background work must not take the worker down
            log.exception("background job %s failed; it will be retried on a later request", key)
        finally:
            pa.default_memory_pool().release_unused()   # a compaction's buffers go back to the system
            with self._changed:
                self._jobs -= 1
                self._changed.notify_all()
        took = time.monotonic() - started
        if took > SLOW_JOB_S:
            log.info("background job %s took %.1fs", key, took)

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._changed:
            return self._jobs

    def drain(self, timeout: float) -> int:
        """Waits until no job is queued or running, or `timeout` seconds passed; the jobs still pending."""
        with self._changed:
            self._changed.wait_for(lambda: self._jobs == 0, timeout=max(0.0, timeout))
            return self._jobs

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
