"""Speculative execution: two attempts of one state task on two executors commit the same version.

A commit is held inside the worker (fault point, ``sleep``) long enough for
Spark to start a speculative copy of the task on the other executor. The copy
commits the version and wins; the original's commit finishes later (or is
killed). Whichever manifest ends up in storage, the next versions must build on
it, and neither worker may delete a file the other's manifest names.
"""

from __future__ import annotations

import pytest

from tests.cluster.conftest import SPECULATION_AFTER_S
from tests.cluster.running_totals import RunningTotals
from tests.cluster.stores import check_versions_load, stored_totals

BATCHES = 9
STUCK_BATCH = 2


@pytest.mark.parametrize("point", ["commit-after-data", "commit-after-manifest"])
def test_speculative_copy_of_a_task_stuck_in_its_commit(cluster, tmp_path, faults, point):
    q = RunningTotals(cluster, tmp_path, seed=len(point))

    def on_batch(batch: int) -> None:
        if batch == STUCK_BATCH - 1:
            faults.arm(point, f"sleep:{SPECULATION_AFTER_S * 4}")

    q.query.on_batch = on_batch
    q.add(BATCHES)
    q.run()
    assert faults.fired(point), f"fault point {point} never fired (does the worker implement SPARK_STATE_FAULT_DIR?)"
    copies = [(t.batch, t.partition) for t in q.attempts() if t.attempt > 0]
    assert (STUCK_BATCH, 0) in copies or (STUCK_BATCH, 1) in copies, \
        f"Spark started no speculative copy in batch {STUCK_BATCH}: {q.attempts()}"
    for batch, partition in copies:
        assert len(set(q.ran_on(batch, partition))) == 2, f"the copy ran on the same executor: {q.attempts()}"
    q.assert_exact()
    assert stored_totals(cluster, q.checkpoint) == q.totals()
    check_versions_load(q.checkpoint)
