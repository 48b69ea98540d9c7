"""The state's history on spark_state, against Spark's HDFS provider on the same queries: the change feed
(``readChangeFeed``) lists what HDFS lists, snapshot replay (``snapshotStartBatchId``) rebuilds the state HDFS
holds at that batch, ``spark_state.read_changes`` returns the change feed's rows without Spark, and a range
retention no longer keeps fails with a message naming the batches instead of returning part of it."""

from __future__ import annotations

import pytest

import spark_state
from spark_state.errors import HistoryUnavailable
from tests.support.running_total import PHASES, SCHEMA, build_query
from tests.support.scenarios import JOIN_STORES, SCENARIOS, run_scenario
from tests.support.spark import JsonStream, arrow_rows, plain, sort_rows, statestore_rows
from tests.support.stores import open_stored

pytestmark = pytest.mark.spark_state_only("spark_state's history: read_changes, one change per key and batch")

FEEDS = [
    ("agg_update", {}),
    ("dedup_watermark", {}),
    ("session_window", {}),
    *[("join_inner", {"storeName": store}) for store in JOIN_STORES],
    ("apply_in_pandas_then_window_agg", {"operatorId": 0}),
]


def change_feed(spark, checkpoint, start: int = 0, **options) -> tuple[list, int]:
    """Spark's change feed of a checkpoint, each key's last write per batch and partition (Spark's HDFS provider
    lists every write; spark_state keeps one row per key and batch), sorted; and how many rows it had."""
    reader = (spark.read.format("statestore").option("readChangeFeed", "true")
              .option("changeStartBatchId", start))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    last = {}
    rows = reader.load(str(checkpoint)).collect()   # in each partition's order: its writes as they happened
    for row in rows:
        last[(row.batch_id, row.partition_id, plain(row.key))] = plain(row)
    return sorted(last.values(), key=repr), len(rows)


def replayed(spark, checkpoint, end: int, start: int, **options) -> list:
    """Both partitions' state at batch `end`, replayed from batch `start` (Spark's snapshotStartBatchId), sorted."""
    rows = []
    for partition in (0, 1):
        rows += statestore_rows(spark, checkpoint, batchId=end, snapshotStartBatchId=start,
                                snapshotPartitionId=partition, **options)
    return sort_rows(rows)


def read_changes_args(options: dict) -> dict:
    return {"operator": int(options.get("operatorId", 0)), "store_name": options.get("storeName")}


@pytest.mark.parametrize("name,options", FEEDS, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                     for n, o in FEEDS])
def test_change_feed_is_hdfs_changes_and_read_changes_returns_it_without_spark(spark, scenario_run, name, options):
    twin = scenario_run(name)
    expected, _ = change_feed(spark, twin.ref.checkpoint, **options)
    got, rows = change_feed(spark, twin.test.checkpoint, **options)
    assert expected, "no changes to compare; the scenario checks nothing"
    assert got == expected
    assert rows == len(got), "spark_state lists each key once per batch"
    assert arrow_rows(spark_state.read_changes(twin.test.checkpoint, **read_changes_args(options))) == got
    later = [r for r in got if r[0] >= 2]
    assert change_feed(spark, twin.test.checkpoint, start=2, changeEndBatchId=2, **options)[0] == \
        [r for r in later if r[0] == 2]
    assert arrow_rows(spark_state.read_changes(twin.test.checkpoint, start_batch=2,
                                               **read_changes_args(options))) == later


def test_apply_in_pandas_with_state_timeouts_and_removals(spark, make_twin, tmp_path):
    """Event-time timeouts remove keys (deletes in the feed), across a restart."""
    events = JsonStream(tmp_path / "events", SCHEMA)
    twin = make_twin(build_query(events, "EventTimeTimeout", "update"), mode="update")
    for phase in PHASES:
        for rows in phase:
            events.add(rows)
        twin.run()
    expected, _ = change_feed(spark, twin.ref.checkpoint)
    assert {r[1] for r in expected} == {"update", "delete"}
    assert change_feed(spark, twin.test.checkpoint)[0] == expected
    assert arrow_rows(spark_state.read_changes(twin.test.checkpoint)) == expected
    end = twin.ref.run_ends[-1]
    assert replayed(spark, twin.test.checkpoint, end, 1) == statestore_rows(spark, twin.ref.checkpoint, batchId=end)


REPLAYS = [("agg_update", {}), ("session_window", {}), ("join_left_outer", {"joinSide": "left"}),
           ("apply_in_pandas_then_window_agg", {"operatorId": 0})]


@pytest.mark.parametrize("name,options", REPLAYS, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                       for n, o in REPLAYS])
def test_snapshot_replay_from_any_batch_is_the_state_hdfs_holds(spark, scenario_run, name, options):
    """spark_state folds any retained version, so replay starts from every batch (HDFS only from batches its
    maintenance snapshotted): the result is the state HDFS holds at the end batch."""
    twin = scenario_run(name)
    end = twin.ref.run_ends[-1]
    expected = statestore_rows(spark, twin.ref.checkpoint, batchId=end, **options)
    for start in (0, end - 1):
        assert replayed(spark, twin.test.checkpoint, end, start, **options) == expected, f"replay from batch {start}"


def test_history_after_compaction_and_retention(spark, tmp_path):
    """A store compacted and retained around 2 versions (as minBatchesToRetain=2 does): the batches whose changes
    compaction folded away fail by name, in Spark's reader and in read_changes; the rest is still HDFS's."""
    def maintain(twin):
        for partition in (0, 1):
            store = open_stored(twin.test.checkpoint, 0, partition, snapshot_interval=1, file_grace_period=0)
            store.maintenance(2)

    twin = run_scenario(spark, tmp_path, SCENARIOS["agg_update"], tested="spark_state", between=maintain)
    maintain(twin)   # versions 1-2 dropped: version 3's chain starts with the snapshot compacted at 2
    with pytest.raises(HistoryUnavailable) as err:
        spark_state.read_changes(twin.test.checkpoint)
    assert "batches 0-1" in str(err.value) and "minBatchesToRetain" in str(err.value)
    assert "complete from batch 2" in str(err.value)
    with pytest.raises(Exception, match="minBatchesToRetain"):
        change_feed(spark, twin.test.checkpoint)
    expected, _ = change_feed(spark, twin.ref.checkpoint, start=2)
    assert change_feed(spark, twin.test.checkpoint, start=2)[0] == expected
    assert arrow_rows(spark_state.read_changes(twin.test.checkpoint, start_batch=2)) == expected
    end = twin.ref.run_ends[-1]
    assert replayed(spark, twin.test.checkpoint, end, 2) == statestore_rows(spark, twin.ref.checkpoint, batchId=end)


def test_a_rescale_starts_each_new_partitions_history_anew(finished, tmp_path):
    """The rescale's batch is written as slices of the old partitions' files, not as changes: asking for it (or
    anything before it) under the new partition count fails by name."""
    ckpt = finished.copy(tmp_path / "ckpt")
    last = finished.query.last_batch()
    spark_state.rescale(str(ckpt), 3)
    with pytest.raises(HistoryUnavailable, match=rf"batches {last + 1} were written as a whole state"):
        spark_state.read_changes(ckpt, start_batch=last + 1)
    with pytest.raises(HistoryUnavailable, match="rescale"):
        spark_state.read_changes(ckpt, start_batch=0)
