"""A worker that dies inside a commit or a compaction loses nothing (issue 9, "Prove it").

The worker's fault injection points stop it exactly between a data file and
the manifest that names it (or after the manifest, before the reply; or between
a compacted snapshot and its record). The shim starts a new worker and retries;
state stays exact, the file left behind is collected by retention (with
``fileGracePeriod=0``) and no file a manifest names is ever deleted.
"""

from __future__ import annotations

import zlib

import pytest

from tests.cluster.processes import Beside, sigkill, wait_or_stop
from tests.cluster.running_totals import RunningTotals
from tests.cluster.stores import check_versions_load, stored_totals, unreferenced_now, wait_collected
from tests.streaming import alive

BATCHES = 9
ARM_AFTER = 1   # armed once batch 1 is done: the point fires in batch 2 (compaction: whenever it runs)


@pytest.mark.parametrize("point,action", [
    ("commit-after-data", "exit"),
    ("commit-after-data", "sigkill"),
    ("commit-after-manifest", "exit"),
    ("compaction-after-snapshot", "exit"),
])
def test_worker_dies_inside_a_commit_or_compaction(cluster, tmp_path, faults, point, action):
    q = RunningTotals(cluster, tmp_path, seed=zlib.crc32(f"{point} {action}".encode()) % 1000)
    leftovers: dict[int, set[str]] = {}
    fired: list[int] = []

    def on_batch(batch: int) -> None:
        if batch == ARM_AFTER:
            faults.arm(point, "sleep:60" if action == "sigkill" else action)
        elif batch > ARM_AFTER and not fired and faults.fired(point):
            fired.append(faults.fired(point)[0])
            # the worker is gone (exit) or killed now (sigkill): what it left unreferenced is garbage
            wait_or_stop(lambda: not alive(fired[0]), beside.done, 30, f"worker {fired[0]} did not die")
            for partition, files in unreferenced_now(q.checkpoint).items():
                leftovers.setdefault(partition, set()).update(files)
        if batch == BATCHES - 1:   # the query still runs: maintenance collects the leftovers
            wait_collected(q.checkpoint, leftovers)

    def killer(done) -> None:
        if action == "sigkill" and wait_or_stop(lambda: bool(faults.fired(point)), done, 150,
                                                f"fault {point} never fired"):
            sigkill(faults.fired(point)[0], "spark_state worker")

    q.query.on_batch = on_batch
    q.add(BATCHES)
    beside = Beside(killer)
    try:
        q.run()
    finally:
        beside.join()
    assert fired, (f"fault point {point} never fired (does the worker implement SPARK_STATE_FAULT_DIR?); "
                   f"armed: {faults.armed()}")
    assert any(leftovers.values()), f"the dead worker left no file behind at {point}; the test proved nothing"
    q.assert_exact()
    assert stored_totals(cluster, q.checkpoint) == q.totals()
    check_versions_load(q.checkpoint)
