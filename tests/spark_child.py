"""A separate Spark application for the tests that need a second driver JVM.

    python -m tests.spark_child '<json config>'

Config keys: ``events`` (input dir), ``checkpoint``, ``options`` (spark_state
options for configure()), ``wait`` (after the run, print and block on stdin
until killed). It runs the running-total applyInPandasWithState query of
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
