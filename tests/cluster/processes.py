"""The processes of the cluster application, found through /proc.

Every executor JVM (``CoarseGrainedExecutorBackend``) is a child of a
standalone worker: of the worker JVMs the harness started (standalone.py), or
of the driver JVM in ``local-cluster`` (whose master and workers run inside
the driver). Each executor's spark_state worker (``python -m
spark_state.worker``) is a child of its executor JVM. Only processes under
this test run's own parents are ever touched: other applications on the
machine are left alone.
"""

from __future__ import annotations

import threading
import time

from pyspark.sql import SparkSession

from tests.support.processes import alive, children, cmdline, driver_jvm_pid, ppid
from tests.support.waiting import wait_until

EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"


#: The processes whose children are the executors (set by the cluster fixture).
_EXECUTOR_PARENTS: list[int] = []


def set_executor_parents(pids: list[int]) -> None:
    _EXECUTOR_PARENTS[:] = pids


def executor_jvms(spark: SparkSession) -> list[int]:
    """Live executor JVMs of this application."""
    parents = _EXECUTOR_PARENTS or [driver_jvm_pid(spark)]
    return [p for parent in parents for p in children(parent) if EXECUTOR_MAIN in cmdline(p) and alive(p)]


def registered_executors(spark: SparkSession) -> int:
    """Executors the driver's scheduler knows (the driver itself not counted)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return len(infos) - 1


def wait_for_executors(spark: SparkSession, count: int = 2, timeout: float = 120) -> list[int]:
    """Waits until ``count`` executor JVMs run and are registered; returns their pids."""
    wait_until(lambda: len(executor_jvms(spark)) >= count and registered_executors(spark) >= count, timeout,
               f"fewer than {count} executors after {timeout}s: JVMs {executor_jvms(spark)}, "
               f"registered {registered_executors(spark)}")
    return executor_jvms(spark)


def executor_of(pid: int) -> int | None:
    """The executor JVM ``pid`` runs under (itself, a parent, a grandparent ...), or None."""
    seen = 0
    while pid and pid > 1 and seen < 8:
        if EXECUTOR_MAIN in cmdline(pid):
            return pid
        pid = ppid(pid) or 0
        seen += 1
    return None


class Beside:
    """Runs ``action`` in a thread while the test runs a query; ``join()`` re-raises its error.

    ``action`` gets a ``threading.Event`` that is set when the test no longer needs it
    (the query ended), so its waits can stop early instead of running out their timeouts.
    """

    def __init__(self, action):
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.result = None

        def run():
            try:
                self.result = action(self.done)
            except BaseException as err:  # noqa: BLE001 - re-raised in join()
                self.error = err

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 60):
        self.done.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"background action still running {timeout}s after the query ended")
        if self.error is not None:
            raise self.error
        return self.result


def wait_or_stop(cond, done, timeout: float, message: str) -> bool:
    """Polls ``cond`` until true (returns True), ``done`` is set (returns False) or ``timeout`` (raises)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        if done.is_set():
            return False
        time.sleep(0.05)
    raise AssertionError(message)
