"""Speculative execution: two attempts of one state task on two executors commit the same version.

A commit is held inside the worker (fault point, ``sleep``) long enough for
Spark to start a speculative copy of the task on the other executor. The copy
commits the version and wins; the original's commit finishes later, after the
copy's. The next batch waits for that late commit, so it runs on storage that no
longer holds what the copy's worker wrote: it must build on what storage holds,
and neither worker may delete a file the other's manifest names.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster.running_totals import RunningTotals
from tests.cluster.session import SPECULATION_AFTER_S
from tests.cluster.stores import assert_maintained, check_versions_load, stored_totals

BATCHES = 9
STUCK_BATCH = 2
STUCK_S = SPECULATION_AFTER_S * 4


@pytest.mark.parametrize("point", ["commit-after-data", pytest.param("commit-after-manifest", marks=pytest.mark.slow)])
def test_speculative_copy_of_a_task_stuck_in_its_commit(cluster, speculation, tmp_path, faults, point):
    q = RunningTotals(cluster, tmp_path, seed=len(point))

    def on_batch(batch: int) -> None:
        if batch == STUCK_BATCH - 1:
            faults.arm(point, f"sleep:{STUCK_S}")
        elif batch == STUCK_BATCH and faults.fired(point):
            # The copy won. The next batch starts once the original's commit resumed (its sleep is over):
            # a late manifest (commit-after-data) then lands before the copy's executor builds on the version.
            resumes = faults.fired_at(point) + STUCK_S + 1
            while time.time() < resumes:
                time.sleep(0.1)

    q.query.on_batch = on_batch
    q.add(BATCHES)
    q.run()
    assert faults.fired(point), f"fault point {point} never fired (does the worker implement SPARK_STATE_FAULT_DIR?)"
    copies = {t.partition for t in q.attempts() if t.batch == STUCK_BATCH and t.attempt > 0}
    assert copies, f"Spark started no speculative copy in batch {STUCK_BATCH}: {q.attempts()}"
    for partition in copies:
        ran = q.ran_on(STUCK_BATCH, partition)
        assert len(set(ran)) == 2, f"the copy ran on the executor of the original: {ran}"
    q.assert_exact()
    assert stored_totals(cluster, q.checkpoint) == q.totals()
    check_versions_load(q.checkpoint)
    assert_maintained(q.checkpoint)
