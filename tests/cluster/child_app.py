"""A second Spark application (``local[2]``) that runs a RunningTotals query once.

    python -m tests.cluster.child_app '<json config>'

Config: ``workdir`` (the RunningTotals directory: input files, task notes),
``checkpoint``, ``options`` (spark_state options). Prints one JSON line:
``{"outputs": {batch: rows}, "error": message | null}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    import spark_state
    from tests.cluster.running_totals import RunningTotals
    from tests.support.spark import QueryFailed, spark_builder

    builder = spark_builder("spark_state cluster tests: second application")
    builder = builder.config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
    spark = spark_state.configure(builder, storage="filesystem").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    q = RunningTotals(spark, Path(config["workdir"]), seed=0, checkpoint=Path(config["checkpoint"]),
                      options=config.get("options", {}))
    result = {"outputs": None, "error": None}
    try:
        q.run()
        result["outputs"] = {str(b): [list(r) for r in rows] for b, rows in q.query.outputs.items()}
    except QueryFailed as err:
        result["error"] = err.message
    print(json.dumps(result), flush=True)
    spark.stop()
    return 0


def run_child(config: dict, log: Path, timeout: float = 240) -> dict:
    """Runs the child application to its end; returns its result (stderr goes to ``log``)."""
    from tests.support.paths import ROOT

    with open(log, "w") as err:
        try:
            done = subprocess.run([sys.executable, "-m", "tests.cluster.child_app", json.dumps(config)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"second application did not end within {timeout}s:\n"
                                 f"{log.read_text()[-3000:]}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"second application printed no result (exit {done.returncode}):\n"
                             f"{log.read_text()[-3000:]}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
