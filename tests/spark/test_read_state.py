"""spark_state.read_state reads every operator's state without Spark, row for row what Spark's
own ``statestore`` reader returns for the same checkpoint and batch."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import spark_state
from spark_state.errors import CheckpointError
from tests.support.scenarios import JOIN_STORES
from tests.support.spark import arrow_rows, sort_rows

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


def test_dictionary_columns_in_the_files_come_back_as_spark_types(spark, make_twin, tmp_path):
    """Repeated strings are stored as Arrow dictionaries (spark_state.format.dictionaries); read_state, the restore
    into the JVM (a restart) and Spark's statestore reader all see plain strings."""
    from pyspark.sql import functions as F

    from tests.support.spark import JsonStream
    from tests.support.stores import store_root

    stream = JsonStream(tmp_path / "in", "k string, country string, v long")
    countries = ["US", "DE", "", "ü"]
    twin = make_twin(lambda s: stream.read(s).groupBy("k").agg(F.max("country").alias("country"),
                                                               F.sum("v").alias("sum")), mode="update")
    stream.add([{"k": f"user-{i:04d}", "country": countries[i % 4], "v": i} for i in range(800)])
    twin.run()
    stream.add([{"k": f"user-{i:04d}", "country": countries[(i + 1) % 4], "v": 1} for i in range(0, 800, 2)])
    twin.run()   # a restart: the state is restored from the files
    twin.assert_same()
    files = sorted(store_root(twin.test.checkpoint).rglob("*.arrow"))
    assert files and any(pa.types.is_dictionary(f.type) for path in files
                         for f in pa.ipc.open_stream(path.read_bytes()).schema.field("value").type)
    for batch in twin.test.run_ends:
        table = spark_state.read_state(str(twin.test.checkpoint), batch=batch)
        assert [f.type for f in table.schema.field("value").type] == [pa.string(), pa.int64()]
        assert table.num_rows == 800
        assert arrow_rows(table) == statestore_rows(spark, twin.test.checkpoint, batch, 0, None)
