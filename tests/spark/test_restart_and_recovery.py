"""Failures: a batch that fails and is retried, a killed worker, a second application on
memory storage, and no worker outliving its driver."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.support.processes import alive, kill_workers, worker_pids
from tests.support.running_total import (
    OUTPUT_SCHEMA, PHASES, SCHEMA, STATE_SCHEMA, build_query, flaky_running_total, query_with_hook as _query,
    running_total,
)
from tests.support.spark import JsonStream, QueryFailed
from tests.support.spark_child import Child
from tests.support.waiting import wait_until


@pytest.mark.parametrize("storage", ["filesystem", "memory"])
def test_failed_batch_is_retried_without_lost_or_doubled_state(make_twin, tmp_path, storage):
    events = JsonStream(tmp_path / "events", SCHEMA)
    marker = tmp_path / "fail-once"
    twin = make_twin(_query(events, flaky_running_total, marker), mode="update", options={"storage": storage})
    twin.ref.build = _query(events, flaky_running_total, tmp_path / "never-exists")
    events.add_all(PHASES[0])
    twin.run()
    # Phase 2: the tested query fails in its second batch, after one successful commit in
    # this run and after the other partition's task may have committed the same version.
    events.add_all(PHASES[1])
    twin.ref.run()
    marker.touch()
    with pytest.raises(QueryFailed, match="injected failure"):
        twin.test.run()
    assert not marker.exists(), "the failure was not injected"
    twin.test.run()  # the restart re-runs the failed batch
    twin.assert_same()
    assert ("a", 23, 4, "timeout") in twin.test.rows()


def pausing_running_total(pause: str, key, pdfs, state):
    """running_total, except that at key "a" it waits while the file ``pause`` exists (having touched
    ``pause + ".reached"``), at most a minute."""
    if key[0] == "a" and os.path.exists(pause):
        Path(pause + ".reached").touch()
        deadline = time.monotonic() + 60
        while os.path.exists(pause) and time.monotonic() < deadline:
            time.sleep(0.05)
    yield from running_total("EventTimeTimeout", key, pdfs, state)


def test_a_provider_unloaded_while_its_task_runs_does_not_fail_the_task(spark, make_twin, tmp_path):
    """Spark's maintenance thread closes a provider the coordinator lists as active elsewhere while a task of
    this executor may still be running on it (the soak saw it fail 22 tasks in an hour). Here every provider is
    closed (``StateStore.stop()``) while a task waits in the middle of its batch: the task goes on, commits, and
    the query's output and state are exact (local mode does not retry a failed task: the query would fail)."""
    events = JsonStream(tmp_path / "events", SCHEMA)
    pause = tmp_path / "pause"
    twin = make_twin(_query(events, pausing_running_total, pause), mode="update", options={"storage": "filesystem"})
    twin.ref.build = _query(events, pausing_running_total, tmp_path / "never-exists")
    events.add_all(PHASES[0])
    twin.run()
    events.add_all(PHASES[1])
    twin.ref.run()
    pause.touch()
    reached = Path(f"{pause}.reached")

    def unload_then_resume():
        try:
            wait_until(reached.exists, 120, "the task never paused mid-batch")
            spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
        finally:
            pause.unlink()

    unloader = threading.Thread(target=unload_then_resume, daemon=True)
    unloader.start()
    twin.test.run()
    unloader.join(timeout=130)
    assert reached.exists(), "the task never paused"
    twin.assert_same()
    assert ("a", 23, 4, "timeout") in twin.test.rows()


@pytest.mark.parametrize("when", ["between runs", "between batches of a run"])
def test_killed_worker_is_replaced_and_state_is_exact(spark, make_twin, tmp_path, when):
    events = JsonStream(tmp_path / "events", SCHEMA)
    twin = make_twin(build_query(events, "EventTimeTimeout", "update"), mode="update",
                     options={"storage": "filesystem"})
    events.add_all(PHASES[0])
    twin.run()
    killed = []
    if when == "between runs":
        killed += kill_workers(spark)
    else:
        first = len(twin.ref.outputs)
        twin.test.on_batch = lambda batch: killed.extend(kill_workers(spark)) if batch in (first, first + 1) else None
    events.add_all(PHASES[1])
    twin.run()
    if twin.test.provider == "spark_state":
        assert killed, "no spark_state worker was found to kill"
    twin.assert_same()


def test_killed_worker_with_memory_storage_never_gives_wrong_state(spark, make_twin, tmp_path):
    """Memory storage loses its data with the worker: the next batch is exact or fails clearly."""
    events = JsonStream(tmp_path / "events", SCHEMA)
    twin = make_twin(build_query(events, "NoTimeout", "update"), mode="update", options={"storage": "memory"})
    events.add_all(PHASES[0])
    twin.run()
    kill_workers(spark)
    events.add_all(PHASES[1])
    twin.ref.run()
    try:
        twin.test.run()
    except QueryFailed as err:
        first_line = err.message.splitlines()[0]
        assert "spark_state" in err.message and "memory" in err.message.lower(), first_line
        assert "has ended" in err.message and "storage=filesystem" in err.message, first_line
        return
    twin.assert_same()


# ------------------------------------------------------------------ child applications

@pytest.mark.parametrize("metadata_dir", [
    True,
    pytest.param(False, marks=pytest.mark.slow),
])
def test_memory_storage_cannot_restore_in_another_application(spark, tested, tmp_path, metadata_dir):
    """Memory storage restarts within an application (see the other tests) but not across two: the second
    application fails with a clear message instead of running on empty state; its worker then exits with it."""
    if tested != "spark_state":
        pytest.skip("needs spark_state")
    options = {"storage": "memory"}
    if metadata_dir:
        options["memory_metadata_dir"] = str(tmp_path / "memory-metadata")
    events = JsonStream(tmp_path / "events", SCHEMA)
    events.add_all(PHASES[0])
    from tests.support.spark import Query

    first = Query(spark, build_query(events, "NoTimeout", "update"), tmp_path / "ckpt", provider="spark_state",
                  options=options)
    first.run()
    events.add_all(PHASES[1])

    started = time.monotonic()
    child = Child(tmp_path, {"events": str(events.path), "checkpoint": str(tmp_path / "ckpt"), "options": options})
    try:
        result = child.result()
        child.proc.wait(60)
    finally:
        child.close()
    assert result["error"] is not None, f"the second application ran on memory state it cannot have: {result}"
    message = result["error"]
    head = message[:message.find("\n\tat ")] if "\n\tat " in message else message[:2000]
    assert "spark_state" in message, head
    assert "memory" in message.lower(), head
    assert "has ended" in message and "storage=filesystem" in message, head
    # no orphan: the child application ended normally; its worker ended with it
    assert result["workers"], "the second application started no spark_state worker"
    wait_until(lambda: not any(alive(p) for p in result["workers"]), 10,
               f"worker(s) {result['workers']} outlived their application")
    assert time.monotonic() - started < 60, "child application took over 60 s; mark this test slow"


@pytest.mark.parametrize("victim", [
    "python driver",
    pytest.param("driver JVM", marks=pytest.mark.slow),
])
def test_no_orphan_worker_after_the_driver_is_killed(tested, tmp_path, victim):
    if tested != "spark_state":
        pytest.skip("needs spark_state")
    events = JsonStream(tmp_path / "events", SCHEMA)
    events.add_all(PHASES[0])
    started = time.monotonic()
    child = Child(tmp_path, {"events": str(events.path), "checkpoint": str(tmp_path / "ckpt"),
                             "options": {"storage": "filesystem"}}, wait=True)
    try:
        result = child.result()
        assert result["error"] is None, result["error"][:2000]
        workers = result["workers"]
        assert workers and all(alive(p) for p in workers), f"no live worker under the child's JVM: {result}"
        os.kill(child.proc.pid if victim == "python driver" else result["jvm"], signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in workers), 15,
                   f"worker(s) {workers} still alive 15 s after the {victim} was SIGKILLed")
        wait_until(lambda: not alive(result["jvm"]), 15, "the child's JVM outlived its Python driver")
    finally:
        child.close()
    assert not worker_pids(result["jvm"])
    assert time.monotonic() - started < 60, "child application took over 60 s; mark this test slow"


def _socket_of(pid: int) -> Path:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(args[args.index(b"--socket-dir") + 1].decode()) / "worker.sock"


def test_worker_whose_socket_was_deleted_is_replaced(spark, tested, make_twin, tmp_path):
    """A /tmp cleaner deleting the worker's socket must not wedge the executor: the shim starts a new worker."""
    if tested != "spark_state":
        pytest.skip("needs spark_state")
    from tests.support.processes import driver_jvm_pid

    events = JsonStream(tmp_path / "events", SCHEMA)
    twin = make_twin(build_query(events, "NoTimeout", "update"), mode="update", options={"storage": "filesystem"})
    events.add_all(PHASES[0])
    twin.run()
    (old,) = worker_pids(driver_jvm_pid(spark))
    _socket_of(old).unlink()
    events.add_all(PHASES[1])
    twin.run()
    twin.assert_same()
    wait_until(lambda: not alive(old), 15, "the orphaned worker was not stopped")
    assert worker_pids(driver_jvm_pid(spark)), "no new worker was started"


def test_failing_maintenance_shows_in_query_progress(spark, tested, tmp_path):
    """Maintenance that keeps failing is reported in every batch's progress (custom metric), not only logged."""
    if tested != "spark_state":
        pytest.skip("needs spark_state")
    from tests.support.spark import provider_conf, sql_conf
    from tests.support.stores import store_root

    events = JsonStream(tmp_path / "events", SCHEMA)
    ckpt = tmp_path / "ckpt"
    events.add(PHASES[0][0])
    with sql_conf(spark, provider_conf("spark_state", storage="filesystem", snapshot_interval=1)):
        query = (build_query(events, "NoTimeout", "update")(spark).writeStream.outputMode("update")
                 .option("checkpointLocation", str(ckpt)).format("noop").trigger(processingTime="200 milliseconds")
                 .start())
    try:
        wait_until(lambda: query.lastProgress is not None and (ckpt / "commits" / "0").exists(), 60,
                   "first batch did not commit")
        # Bit rot in every state file so far: the running query never reads them again (it holds its state in
        # memory), but compaction of every later version must read one of them, and fails every time.
        for partition in range(2):
            for path in (store_root(ckpt, 0, partition) / "shared").glob("*.arrow"):
                data = bytearray(path.read_bytes())
                data[len(data) // 2] ^= 0xFF
                path.write_bytes(bytes(data))

        def reported() -> bool:
            events.add([{"k": "a", "v": 1, "ts": "2026-01-01T00:00:01.000000Z"}])
            time.sleep(1.0)
            progress = query.lastProgress or {}
            return any(op.get("customMetrics", {}).get("sparkStateMaintenanceFailures", 0) > 0
                       for op in progress.get("stateOperators", []))

        wait_until(reported, 90, "failing maintenance never showed in the query's progress")
        assert query.exception() is None, "a maintenance failure must not fail the query"
    finally:
        query.stop()


def test_changes_spanning_many_body_segments_commit_and_restore(spark, tested, make_twin, tmp_path):
    """A partition's change log goes to the worker in segments (2 GiB would not fit one Java array); with
    64-byte segments every commit of this query crosses many segment boundaries, and state stays exact."""
    if tested != "spark_state":
        pytest.skip("needs spark_state")
    system = spark._jvm.java.lang.System
    system.setProperty("spark_state.bodySegmentBytes", "64")
    try:
        events = JsonStream(tmp_path / "events", SCHEMA)
        twin = make_twin(build_query(events, "NoTimeout", "update"), mode="update",
                         options={"storage": "filesystem"})
        events.add_all(PHASES[0])
        twin.run()
        events.add_all(PHASES[1])
        twin.run()
        twin.assert_same()
    finally:
        system.clearProperty("spark_state.bodySegmentBytes")
