"""A checkpoint deleted and re-created at the same path is a new timeline (issue 9, defect 3).

Deleting a checkpoint directory and starting the query again at the same path
is a notebook and test habit. The new run's version 1 must never be mixed with
the old run's versions: not through a worker's cached view of the store (same
application) and not through a shared ``checkpointRoot`` where the old run's
higher versions still sit (same or a new application).
"""

from __future__ import annotations

import pytest

from tests.cluster.child_app import run_child
from tests.cluster.running_totals import RunningTotals
from tests.cluster.stores import check_versions_load, stored_totals
from tests.support.spark import rm_rf, sort_rows


def _timelines(cluster, tmp_path, options, first_batches=5, second_fails=(1,)):
    """The first timeline, run to the end and deleted; returns the second one (nothing run yet).

    The first timeline fails each task of batch 1 after its commit (the retry runs on the
    other executor), so both executors' workers have held both partitions' stores when the
    checkpoint is deleted.
    """
    ckpt = tmp_path / "ckpt"
    first = RunningTotals(cluster, tmp_path / "first", seed=41, checkpoint=ckpt, options=options,
                          fail_batches={1})
    first.add(first_batches)
    first.run()
    first.assert_exact()
    rm_rf(ckpt)
    return RunningTotals(cluster, tmp_path / "second", seed=42, checkpoint=ckpt, options=options,
                         fail_batches=second_fails)


@pytest.mark.parametrize("root", [False, True], ids=["state-dir", "checkpointRoot"])
def test_deleted_checkpoint_reused_in_the_same_application(cluster, tmp_path, root):
    options = {"checkpoint_root": (tmp_path / "root").as_uri()} if root else {}
    second = _timelines(cluster, tmp_path, options)
    second.add(4)
    second.run()
    second.assert_exact()
    assert stored_totals(cluster, second.checkpoint, **options) == second.totals()
    if not root:
        check_versions_load(second.checkpoint)


def test_deleted_checkpoint_reused_by_a_new_application(cluster, tmp_path):
    """The old run left versions 5 and 6 under checkpointRoot; a new application starts over at v1 there, then
    this application continues the new timeline from the new application's checkpoint."""
    options = {"checkpoint_root": (tmp_path / "root").as_uri()}
    # the child is local[2] (nowhere else to retry): the second timeline's plan has no failing step
    second = _timelines(cluster, tmp_path, options, first_batches=6, second_fails=())
    second.add(3)
    result = run_child({"workdir": str(second.workdir), "checkpoint": str(second.checkpoint),
                        "options": options}, tmp_path / "child.log")
    assert result["error"] is None, result["error"]
    second.query.outputs.update({int(b): sort_rows(tuple(r) for r in rows) for b, rows in result["outputs"].items()})
    second.assert_exact()
    second.add(3)
    second.run()
    second.assert_exact()
    assert stored_totals(cluster, second.checkpoint, **options) == second.totals()
