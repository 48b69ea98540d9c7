"""A separate Spark application for the tests that need a second driver JVM.

    python -m tests.spark_child '<json config>'

Config keys: ``events`` (input dir), ``checkpoint``, ``options`` (spark_state
options for configure()), ``wait`` (after the run, print and block on stdin
until killed), ``watch_before`` (seconds to watch for a worker of the driver
JVM before the query starts; reported as ``workers_before`` and, per worker,
whether its log says its warm-up finished: ``warmed_before``). It runs the running-total applyInPandasWithState query of
test_apply_in_pandas_with_state once over the available input and prints one
JSON line: {"jvm": pid, "workers": [pids], "outputs": {batch: rows} | null,
"error": message | null}.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    import spark_state
    from tests.conftest import spark_builder
    from tests.streaming import JsonStream, Query, QueryFailed, driver_jvm_pid, worker_pids
    from tests.test_apply_in_pandas_with_state import SCHEMA, build_query

    builder = spark_builder("spark_state tests: child application")
    spark = spark_state.configure(builder, **config.get("options", {})).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    events = JsonStream(config["events"], SCHEMA)
    query = Query(spark, build_query(events, "NoTimeout", "update"), config["checkpoint"],
                  mode="update", provider="spark_state", options=config.get("options", {}))
    result = {"jvm": driver_jvm_pid(spark), "outputs": None, "error": None}
    if config.get("watch_before"):
        result["workers_before"], result["warmed_before"] = _watch_workers(result["jvm"], config["watch_before"])
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
    from pathlib import Path

    from tests.streaming import _cmdline, worker_pids

    def warmed(pid: int) -> bool:
        args = _cmdline(pid).split()
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
