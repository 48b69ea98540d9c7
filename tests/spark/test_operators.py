"""Every stateful operator on spark_state, restarted half-way, gives the HDFS provider's output."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from tests.support.scenarios import EVENTS, SCENARIOS, running_count
from tests.support.spark import JsonStream, Query, QueryFailed, ts
from tests.support.transform_with_state import transform_with_state


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_output_as_hdfs_across_a_restart(scenario_run, name):
    twin = scenario_run(name)
    twin.assert_same()
    assert twin.test.runs == 2
    assert twin.ref.rows(), "the scenario produced no output at all; it checks nothing"


def _run_once(spark, tmp_path, build, mode, provider):
    events = JsonStream(tmp_path / f"events-{provider}", EVENTS)
    events.add([{"k": "a", "v": 1, "ts": ts(1)}, {"k": "b", "v": 2, "ts": ts(2)}])
    query = Query(spark, lambda s: build(events.read(s)), tmp_path / f"ckpt-{provider}", mode=mode,
                  provider=provider)
    query.run()
    return query


def test_apply_in_pandas_with_aggregation_in_update_mode_is_refused_as_with_hdfs(spark, tested, tmp_path):
    """Spark 4.3 refuses applyInPandasWithState + aggregation in update mode; the refusal is Spark's own.

    (The allowed combination, append mode with a watermark, is the scenario
    apply_in_pandas_then_window_agg above.)
    """
    def build(events):
        return (events.groupBy("k")
                .applyInPandasWithState(running_count, "k string, count long, total long, ts timestamp",
                                        "count long, total long", "update", "NoTimeout")
                .groupBy("k").agg(F.max("count").alias("c")))

    errors = {}
    for provider in ("hdfs", tested):
        with pytest.raises(AnalysisException) as err:
            _run_once(spark, tmp_path, build, "update", provider)
        errors[provider] = str(err.value).split(";")[0]
    assert "not supported with aggregation" in errors["hdfs"]
    assert errors[tested] == errors["hdfs"]


needs_protobuf = pytest.mark.skipif(
    __import__("importlib").util.find_spec("google.protobuf") is None,
    reason="transformWithStateInPandas needs the protobuf package (pip install protobuf)")


@needs_protobuf
def testtransform_with_state_fails_with_a_clear_message(spark, tested, tmp_path):
    """transformWithState needs column families (RocksDB only): the user is told so, by Spark or by us."""
    with pytest.raises((QueryFailed, AnalysisException)) as err:
        _run_once(spark, tmp_path, transform_with_state, "update", tested)
    message = str(err.value)
    assert "column famil" in message.lower() or "RocksDB" in message, message[:3000]
    assert "Traceback" not in message.split("\n")[0]
    # Spark's refusal cannot say how a query on spark_state keeps its state; the driver's listener logs it
    listeners = spark.conf.get("spark.sql.streaming.streamingQueryListeners", "")
    assert "io.sparkstate.shim.MaintenanceWarnings" in listeners
    advice = spark._jvm.io.sparkstate.shim.MaintenanceWarnings.advice(message)
    if "STORE_BACKEND_NOT_SUPPORTED_FOR_TWS" in message:   # Spark 4.2+; older Spark reaches our own refusal
        assert advice and "--to rocksdb" in advice and "Moving to transformWithState" in advice
    else:
        assert "--to rocksdb" in message


@pytest.mark.slow
@needs_protobuf
def testtransform_with_state_runs_on_rocksdb(spark, tmp_path):
    """Control: the same query is valid Spark (it runs on RocksDB), so the failure above is about the store."""
    events = JsonStream(tmp_path / "events", EVENTS)
    events.add([{"k": "a", "v": 1, "ts": ts(1)}, {"k": "a", "v": 2, "ts": ts(2)}])
    query = Query(spark, lambda s: transform_with_state(events.read(s)), tmp_path / "ckpt", mode="update",
                  provider="hdfs",
                  conf={"spark.sql.streaming.stateStore.providerClass":
                        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
    query.run()
    assert query.rows() == [("a", 2)]
