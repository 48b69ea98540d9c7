"""Polling for something another process does (a worker exiting, maintenance finishing): bounded waits
that fail with a message, never timed assertions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable


def wait_until(cond: Callable[[], bool], timeout: float, message: str) -> None:
    """Returns once ``cond()`` is true; fails with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(message)


def wait_until_settled(path: Path, quiet: float = 3.0, timeout: float = 60.0) -> None:
    """Returns once no file under `path` appeared, vanished or changed size for `quiet` seconds.

    After ``query.stop()`` one background maintenance run per store (compaction, retention) may still
    be under way; a test that copies or inspects a stopped query's checkpoint file by file waits for it
    (``quiet`` is above the tests' 2 s maintenance interval; a compaction of these small test
    checkpoints takes milliseconds, so a quiet spell means the run is over).
    """
    def listing():
        out = {}
        for p in Path(path).rglob("*"):
            try:
                out[str(p)] = p.stat().st_size
            except FileNotFoundError:
                pass
        return out

    deadline = time.monotonic() + timeout
    last, since = listing(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise AssertionError(f"files under {path} still changing after {timeout:.0f} s")
        time.sleep(0.5)
        now = listing()
        if now != last:
            last, since = now, time.monotonic()
