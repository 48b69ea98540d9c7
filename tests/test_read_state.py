"""spark_state.read_state reads every operator's state without Spark, row for row what Spark's
own ``statestore`` reader returns for the same checkpoint and batch."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import spark_state
from spark_state.sparklog import CheckpointError
from tests.scenarios import JOIN_STORES, SCENARIOS
from tests.streaming import arrow_rows, sort_rows

#: (scenario, operator, store): every operator kind, the four stores of a join, both operators of a chain.
READS = [(name, 0, None) for name in ("agg_update", "agg_complete", "window_agg_append", "dedup", "dedup_watermark",
                                       "dedup_within_watermark", "session_window")]
READS += [("join_inner", 0, store) for store in JOIN_STORES]
READS += [("apply_in_pandas_then_window_agg", 0, None), ("apply_in_pandas_then_window_agg", 1, None)]


def statestore_rows(spark, checkpoint, batch, operator, store):
    reader = spark.read.format("statestore").option("batchId", batch).option("operatorId", operator)
    if store is not None:
        reader = reader.option("storeName", store)
    return sort_rows(reader.load(str(checkpoint)).select("partition_id", "key", "value").collect())


@pytest.mark.parametrize("name,operator,store", READS, ids=[f"{n}-{o}-{s or 'default'}" for n, o, s in READS])
def test_read_state_equals_the_statestore_reader(spark, scenario_run, name, operator, store):
    twin = scenario_run(name)
    seen = 0
    for batch in (twin.test.run_ends[0], twin.test.run_ends[-1]):
        table = spark_state.read_state(str(twin.test.checkpoint), operator, store, batch=batch)
        assert table.column_names == ["partition", "key", "value"]
        expected = statestore_rows(spark, twin.test.checkpoint, batch, operator, store)
        assert arrow_rows(table) == expected, f"batch {batch}"
        # ... which is also what the HDFS provider's checkpoint of the same query holds
        assert expected == statestore_rows(spark, twin.ref.checkpoint, batch, operator, store)
        seen += table.num_rows
    assert seen, "no state to compare; the scenario checks nothing"


def test_read_state_works_with_duckdb_polars_and_pandas(scenario_run):
    twin = scenario_run("agg_update")
    t = spark_state.read_state(str(twin.test.checkpoint))
    totals = dict(duckdb.sql("select key.k, value.sum from t").fetchall())
    assert totals == {k: s for k, s in zip(pl.from_arrow(t)["key"].struct.field("k"),
                                            pl.from_arrow(t)["value"].struct.field("sum"))}
    pdf = t.to_pandas()
    assert sorted(totals) == sorted(row["k"] for row in pdf["key"]) and totals


def test_read_state_picks_batches_partitions_and_stores(scenario_run):
    twin = scenario_run("join_inner")
    ckpt = str(twin.test.checkpoint)
    with pytest.raises(CheckpointError, match="has stores .*pass store_name"):
        spark_state.read_state(ckpt)
    with pytest.raises(CheckpointError, match="no store 'nope'"):
        spark_state.read_state(ckpt, store_name="nope")
    with pytest.raises(CheckpointError, match="no operator 3"):
        spark_state.read_state(ckpt, 3)
    with pytest.raises(CheckpointError, match="partitions \\[7\\] do not exist"):
        spark_state.read_state(ckpt, store_name=JOIN_STORES[0], partitions=[7])
    with pytest.raises(CheckpointError, match="not committed"):
        spark_state.read_state(ckpt, store_name=JOIN_STORES[0], batch=999)
    first = spark_state.read_state(ckpt, store_name=JOIN_STORES[1], batch=twin.test.run_ends[0])
    one = spark_state.read_state(ckpt, store_name=JOIN_STORES[1], batch=twin.test.run_ends[0], partitions=[1])
    assert set(one.column("partition").to_pylist()) <= {1}
    assert one.num_rows == pa.compute.sum(pa.compute.equal(first.column("partition"), 1)).as_py()


def test_read_state_refuses_another_providers_checkpoint(scenario_run):
    twin = scenario_run("agg_update")
    with pytest.raises(CheckpointError, match="not a spark_state checkpoint"):
        spark_state.read_state(str(twin.ref.checkpoint))
