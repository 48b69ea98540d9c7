"""Spark's own ``statestore`` reader reads what spark_state stored, for every operator,
exactly as it reads the HDFS provider's state for the same query."""

from __future__ import annotations

import pytest

from tests.support.scenarios import JOIN_STORES
from tests.support.spark import statestore_rows

READS = [
    ("agg_update", {}),
    ("agg_complete", {}),
    ("window_agg_append", {}),
    ("dedup", {}),
    ("dedup_watermark", {}),
    ("dedup_within_watermark", {}),
    ("session_window", {}),
    ("join_left_outer", {"joinSide": "left"}),
    ("join_left_outer", {"joinSide": "right"}),
    *[("join_inner", {"storeName": store}) for store in JOIN_STORES],
    ("apply_in_pandas_then_window_agg", {"operatorId": 0}),
    ("apply_in_pandas_then_window_agg", {"operatorId": 1}),
]


@pytest.mark.parametrize("name,options", READS, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                     for n, o in READS])
def test_reader_reads_the_same_state_as_from_hdfs(spark, scenario_run, name, options):
    twin = scenario_run(name)
    seen = 0
    # the state at the end of the first run (before eviction) and at the end
    for batch in (twin.ref.run_ends[0], twin.ref.run_ends[-1]):
        expected = statestore_rows(spark, twin.ref.checkpoint, batchId=batch, **options)
        got = statestore_rows(spark, twin.test.checkpoint, batchId=batch, **options)
        assert got == expected, f"batch {batch}: expected {expected}\n got {got}"
        seen += len(expected)
    assert seen, "no state to compare; the scenario checks nothing"
