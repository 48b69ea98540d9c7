"""An executor JVM SIGKILLed in the middle of a batch or of a commit loses no committed state.

The standalone master starts a new executor; the batch's tasks re-run on the
survivor (Spark also recomputes the shuffle output lost with the dead JVM).
The dead executor's worker dies with it, possibly between a data file and its
manifest; that file must never be mistaken for state, and retention collects it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.processes import executor_jvms, executor_of, wait_or_stop
from tests.cluster.running_totals import RunningTotals
from tests.cluster.stores import (assert_maintained, check_versions_load, stored_totals, unreferenced_now,
                                  wait_collected)
from tests.support.processes import sigkill

BATCHES = 8
TROUBLE_BATCH = 3


def _run_and_kill(cluster, q: RunningTotals, arm, find_victim, after_batch=None) -> int:
    """Runs every batch; before TROUBLE_BATCH calls ``arm()``; kills the executor ``find_victim`` names.

    ``after_batch(batch)`` runs in the driver after each batch (the query still runs).
    """
    before = set(executor_jvms(cluster))

    def on_batch(batch: int) -> None:
        if batch == TROUBLE_BATCH - 1:
            arm()
        if after_batch is not None:
            after_batch(batch)

    def killer(done) -> int | None:
        victim = find_victim(done)
        if victim is None:
            return None
        assert victim in before, f"pid {victim} is not an executor JVM of this application ({sorted(before)})"
        sigkill(victim, "executor JVM")
        return victim

    victim = q.run_beside(BATCHES, on_batch, killer)
    assert victim is not None, "nothing was killed; the test proved nothing"
    return victim


def test_executor_killed_while_a_task_runs_its_udf(cluster, tmp_path):
    q = RunningTotals(cluster, tmp_path, seed=31)

    def find_victim(done):
        at = Path(f"{q.stall_marker}.at")
        if not wait_or_stop(at.exists, done, 150, "no task stalled"):
            return None
        return int(at.read_text())

    victim = _run_and_kill(cluster, q, q.stall_next_task, find_victim)
    q.assert_exact()
    assert any(t.executor == victim and t.batch == TROUBLE_BATCH for t in q.attempts())
    assert stored_totals(cluster, q.checkpoint) == q.totals()
    check_versions_load(q.checkpoint)
    assert_maintained(q.checkpoint)


@pytest.mark.parametrize("point", ["commit-after-data", "stage-after-chunk"])
def test_executor_killed_between_a_data_file_and_its_manifest(cluster, tmp_path, faults, point):
    """The worker sleeps after writing the data file of a commit (or a chunk of a streamed commit, while the
    task still runs); its executor is SIGKILLed meanwhile. The task is retried on the other executor; the
    (partial) data file left behind is collected by retention; no file a manifest names is touched."""
    q = RunningTotals(cluster, tmp_path, seed=37 if point == "commit-after-data" else 38)
    orphans = {}

    def find_victim(done):
        if not wait_or_stop(lambda: bool(faults.fired(point)), done, 150,
                            f"fault {point} never fired (does the worker implement SPARK_STATE_FAULT_DIR?)"):
            return None
        return executor_of(faults.fired(point)[0])

    def on_last_batches(batch: int) -> None:
        if batch == TROUBLE_BATCH:
            orphans.update(unreferenced_now(q.checkpoint))
        if batch == BATCHES - 1:   # the query still runs: maintenance collects the leftovers
            wait_collected(q.checkpoint, orphans)

    _run_and_kill(cluster, q, lambda: faults.arm(point, "sleep:60"), find_victim, on_last_batches)
    assert any(orphans.values()), "the killed commit left no data file behind; the test proved nothing"
    q.assert_exact()
    assert stored_totals(cluster, q.checkpoint) == q.totals()
    check_versions_load(q.checkpoint)
    assert_maintained(q.checkpoint)
