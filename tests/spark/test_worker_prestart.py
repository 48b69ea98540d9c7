"""The executor plugin starts the state worker when the executor starts, before any task needs it; the worker
imports and warms up what commits and restores need in the background, and the JVM runs its restore path once. The
option prestartWorker=false leaves the start to the first state store (a fresh application each, since the plugin
runs once per executor)."""

from __future__ import annotations

from tests.support.running_total import PHASES, SCHEMA
from tests.support.spark import JsonStream
from tests.support.spark_child import Child


def _run_child(tmp_path, options: dict, watch: float) -> dict:
    events = JsonStream(tmp_path / "events", SCHEMA)
    events.add_all(PHASES[0])
    child = Child(tmp_path, {"events": str(events.path), "checkpoint": str(tmp_path / "ckpt"), "options": options,
                             "watch_before": watch})
    try:
        return child.result(timeout=180)
    finally:
        child.close()


def test_worker_is_running_and_warm_before_the_first_task(spark, tested, tmp_path):
    if tested != "spark_state":
        import pytest

        pytest.skip("needs spark_state")
    result = _run_child(tmp_path, {"storage": "filesystem"}, watch=60)
    assert result["error"] is None, result["error"]
    assert len(result["workers_before"]) == 1, result
    assert result["warmed_before"] == [True], "the worker's log has no 'warm-up done' before the first query"
    assert result["jvm_warmed_before"], "the plugin did not run the JVM's restore path before the first query"
    # The query's stores used that worker: no second one was started.
    assert result["workers"] == result["workers_before"], result
    assert result["outputs"], result


def test_prestart_off_starts_the_worker_with_the_first_store(spark, tested, tmp_path):
    if tested != "spark_state":
        import pytest

        pytest.skip("needs spark_state")
    result = _run_child(tmp_path, {"storage": "filesystem", "prestart_worker": False}, watch=5)
    assert result["error"] is None, result["error"]
    assert result["workers_before"] == [] and result["jvm_warmed_before"] is False, result
    assert len(result["workers"]) == 1 and result["outputs"], result
