"""The worker's fault injection points, driven from the test process.

The contract (issue 9): a worker whose environment has
``SPARK_STATE_FAULT_DIR=<dir>`` checks for ``<dir>/<point>`` at each named
point, claims it by renaming it to ``<dir>/<point>.fired-<pid>-<n>`` (one
process fires per file) and performs the action written in it: ``exit``
(``os._exit(137)``) or ``sleep:<seconds>``. The cluster session sets the
variable for its executors, so every worker of the application sees the same
directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from spark_state.faults import POINTS
from tests.support.waiting import wait_until

_FIRED = re.compile(r"^(?P<point>[a-z-]+)\.fired-(?P<pid>\d+)-(?P<n>\d+)$")


class Faults:
    """Arms points, tells which fired and in which worker (pid)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def arm(self, point: str, action: str) -> None:
        """Arms ``point`` once: the next worker that reaches it performs ``action``."""
        if point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}; the contract names {POINTS}")
        tmp = self.root / f".{point}.tmp"
        tmp.write_text(action)
        tmp.rename(self.root / point)   # appears complete: a worker never reads half an action

    def armed(self) -> list[str]:
        """Points armed and not fired yet."""
        return sorted(p.name for p in self.root.iterdir() if p.name in POINTS)

    def fired(self, point: str) -> list[int]:
        """Pids of the workers that fired ``point`` so far (in firing order)."""
        out = []
        for p in self.root.iterdir():
            m = _FIRED.match(p.name)
            if m and m["point"] == point:
                out.append((int(m["n"]), p.stat().st_mtime_ns, int(m["pid"])))
        return [pid for _, _, pid in sorted(out, key=lambda t: (t[1], t[0]))]

    def fired_at(self, point: str) -> float:
        """When ``point`` first fired (the claim renamed the file: its ctime), as time.time()."""
        times = [p.stat().st_ctime for p in self.root.iterdir()
                 if (m := _FIRED.match(p.name)) and m["point"] == point]
        if not times:
            raise AssertionError(f"fault point {point} has not fired")
        return min(times)

    def wait_fired(self, point: str, timeout: float = 60) -> int:
        """Waits until ``point`` has fired; returns the worker's pid."""
        wait_until(lambda: bool(self.fired(point)), timeout,
                   f"fault point {point!r} armed in {self.root} never fired within {timeout}s "
                   f"(does the worker implement SPARK_STATE_FAULT_DIR?); still armed: {self.armed()}")
        return self.fired(point)[0]

    def clear(self) -> list[str]:
        """Disarms and forgets everything; returns the points that were armed and never fired."""
        left = self.armed()
        for p in self.root.iterdir():
            p.unlink()
        return left
