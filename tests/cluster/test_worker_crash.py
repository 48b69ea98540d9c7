"""A worker that dies inside a commit or a compaction loses nothing (issue 9, "Prove it").

The worker's fault injection points stop it exactly between a data file and
the manifest that names it (or after the manifest, before the reply; or between
a compacted snapshot and its record; or after a chunk of a streamed commit, while
the task still runs: the shim sends the chunks again to the new worker). The shim starts a new worker and retries;
state stays exact, the file left behind is collected by retention (with
``fileGracePeriod=0``) and no file a manifest names is ever deleted.
"""

from __future__ import annotations

import zlib

import pytest

from tests.cluster.processes import wait_or_stop
from tests.cluster.running_totals import RunningTotals
from tests.cluster.stores import (assert_maintained, check_versions_load, stored_totals, unreferenced_now,
                                  wait_collected)
from tests.support.processes import alive, sigkill
from tests.support.waiting import wait_until

BATCHES = 9
ARM_AFTER = 1   # armed once batch 1 is done: the point fires in batch 2 (compaction: whenever it runs)


@pytest.mark.parametrize("point,action", [
    ("stage-after-chunk", "exit"),
    ("commit-after-data", "exit"),
    ("commit-after-data", "sigkill"),
    ("commit-after-manifest", "exit"),
    ("compaction-after-snapshot", "exit"),
])
def test_worker_dies_inside_a_commit_or_compaction(cluster, tmp_path, faults, point, action):
    q = RunningTotals(cluster, tmp_path, seed=zlib.crc32(f"{point} {action}".encode()) % 1000)
    seen: dict = {}
    leftovers: dict[int, set[str]] = {}

    def watch(done) -> None:
        """Waits for the fault, kills the worker if asked, notes what it left unreferenced once it is dead."""
        if not wait_or_stop(lambda: bool(faults.fired(point)), done, 150, f"fault {point} never fired"):
            return
        pid = faults.fired(point)[0]
        if action == "sigkill":
            sigkill(pid, "spark_state worker")
        wait_or_stop(lambda: not alive(pid), done, 30, f"worker {pid} did not die at {point}")
        seen["at death"] = unreferenced_now(q.checkpoint)

    def on_batch(batch: int) -> None:
        if batch == ARM_AFTER:
            faults.arm(point, "sleep:60" if action == "sigkill" else action)
        elif "at death" in seen and "after retry" not in seen:
            # the batch is done, so the shim's retry re-committed: what the dead worker wrote is unreferenced now
            seen["after retry"] = unreferenced_now(q.checkpoint)
        if batch == BATCHES - 1:   # the query still runs: maintenance collects the leftovers
            wait_until(lambda: "after retry" in seen, 30, f"fault {point} did not fire in time")
            for when in ("at death", "after retry"):
                for partition, files in seen[when].items():
                    leftovers.setdefault(partition, set()).update(files)
            wait_collected(q.checkpoint, leftovers)

    q.run_beside(BATCHES, on_batch, watch)
    assert faults.fired(point), f"fault point {point} never fired (does the worker implement SPARK_STATE_FAULT_DIR?)"
    assert any(leftovers.values()), f"the dead worker left no file behind at {point}; the test proved nothing"
    q.assert_exact()
    assert stored_totals(cluster, q.checkpoint) == q.totals()
    check_versions_load(q.checkpoint)
    assert_maintained(q.checkpoint)
