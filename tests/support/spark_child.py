"""A separate Spark application for the tests that need a second driver JVM.

    python -m tests.support.spark_child '<json config>'

Config keys: ``events`` (input dir), ``checkpoint``, ``options`` (spark_state
options for configure()), ``wait`` (after the run, print and block on stdin
until killed), ``watch_before`` (seconds to watch for a worker of the driver
JVM before the query starts; reported as ``workers_before`` and, per worker,
whether its log says its warm-up finished: ``warmed_before``). It runs the running-total applyInPandasWithState query of
tests/support/running_total.py once over the available input and prints one
JSON line: {"jvm": pid, "workers": [pids], "outputs": {batch: rows} | null,
"error": message | null}. ``Child`` starts it and reads that line.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.paths import ROOT


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    import spark_state
    from tests.support.processes import driver_jvm_pid, worker_pids
    from tests.support.running_total import SCHEMA, build_query
    from tests.support.spark import JsonStream, Query, QueryFailed, spark_builder

    builder = spark_builder("spark_state tests: child application")
    spark = spark_state.configure(builder, **config.get("options", {})).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    events = JsonStream(config["events"], SCHEMA)
    query = Query(spark, build_query(events, "NoTimeout", "update"), config["checkpoint"],
                  mode="update", provider="spark_state", options=config.get("options", {}))
    result = {"jvm": driver_jvm_pid(spark), "outputs": None, "error": None}
    if config.get("watch_before"):
        result["workers_before"], result["warmed_before"] = _watch_workers(result["jvm"], config["watch_before"])
        result["jvm_warmed_before"] = _watch_jvm_warm_up(spark, 60 if result["workers_before"] else 0)
    try:
        query.run()
        result["outputs"] = {str(b): [list(r) for r in rows] for b, rows in query.outputs.items()}
    except QueryFailed as err:
        result["error"] = err.message
    result["workers"] = worker_pids(result["jvm"])
    print(json.dumps(result), flush=True)
    if config.get("wait"):
        sys.stdin.read()
    spark.stop()
    return 0


def _watch_workers(jvm: int, seconds: float) -> tuple[list[int], list[bool]]:
    """The workers of ``jvm`` once one has finished its warm-up, or after ``seconds``."""
    import time

    from tests.support.processes import cmdline, worker_pids

    def warmed(pid: int) -> bool:
        args = cmdline(pid).split()
        log = Path(args[args.index("--socket-dir") + 1]) / "worker.log" if "--socket-dir" in args else None
        try:
            return log is not None and "warm-up done" in log.read_text()
        except OSError:
            return False

    deadline = time.monotonic() + seconds
    while True:
        pids = worker_pids(jvm)
        done = [warmed(p) for p in pids]
        if any(done) or time.monotonic() > deadline:
            return pids, done
        time.sleep(0.2)


def _watch_jvm_warm_up(spark, seconds: float) -> bool:
    """Whether the executor plugin's warm-up of the restore path (Engine.warmUp, after the worker's start) has run in
    this local application's executor, the driver JVM, waiting at most ``seconds``."""
    import time

    engine = spark.sparkContext._jvm.io.sparkstate.shim.engine.Engine.executor()
    deadline = time.monotonic() + seconds
    while not engine.warmedUp() and time.monotonic() < deadline:
        time.sleep(0.2)
    return bool(engine.warmedUp())


class Child:
    """A running second Spark application (main() above, in a process of its own); its stderr goes to a file, never a
    full pipe."""

    def __init__(self, tmp_path: Path, config: dict, *, wait: bool = False):
        self.log_path = tmp_path / "child-stderr.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.spark_child", json.dumps({**config, "wait": wait})],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def result(self, timeout: float = 120) -> dict:
        """The child's JSON result line, waiting at most ``timeout`` s."""
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                if line.startswith("{"):
                    lines.put(line)
                    return
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self.close()
            raise AssertionError(f"child application printed no result:\n{self.log_path.read_text()[-4000:]}")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self.log.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
