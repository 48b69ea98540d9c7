"""A stand-alone spark_state application, run with the Python of an installed spark_state.

It imports nothing from this repository (only spark_state and pyspark), so it proves that an
install works on its own: from a wheel, beside any supported pyspark, with no JDK.

    python wheel_app.py WORKDIR PHASE [--configure] [--master URL] [--option key=value ...]
                        [--checkpoint-format N [N]]

Phase N adds input file N under WORKDIR/events and runs a running-total
``applyInPandasWithState`` query once (availableNow) from WORKDIR/checkpoint; run phase 1,
then phase 2 in a new process to restart from the checkpoint. ``--configure`` turns
spark_state on with ``spark_state.configure(builder)``; without it, the application expects
the plain conf (``--jars`` and ``--conf`` lines, e.g. from spark-submit). It prints one line
``RESULT {json}``: Spark's version, the shim jar, whether javac is on PATH, the provider
class in use, the query listeners registered (spark_state's maintenance warnings among them),
the provider-contract check (abstract methods the shim classes leave
unimplemented on this Spark), each key's latest total and the Python that ran the UDF; from
phase 2 on also the state's history: Spark's change feed and snapshot replay
(``SupportsFineGrainedReplay``, whose signatures differ between Spark 4.0 and 4.1+) and
``spark_state.read_changes``. ``--checkpoint-format 2`` runs the query with Spark's checkpoint format v2
(state store checkpoint ids); the result then names the ids of the last commit log entry (``unique_ids``).
``--checkpoint-format 1 2`` runs the query once per format in the same application, each from a checkpoint
of its own (WORKDIR/checkpoint-v1, checkpoint-v2): the result's ``queries`` holds each one's totals, Python,
history and ids (the top level keeps the first's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

#: Rows of input file N; the expected totals after phase N are the sums over files 1..N.
EVENTS = {
    1: [("a", 1), ("b", 2), ("a", 3)],
    2: [("a", 10), ("c", 5)],
    3: [("b", 100)],
}

SHIM_CLASSES = {
    "io.sparkstate.shim.SparkStateProvider": "org.apache.spark.sql.execution.streaming.state.StateStoreProvider",
    "io.sparkstate.shim.SparkStateStore": "org.apache.spark.sql.execution.streaming.state.StateStore",
    "io.sparkstate.shim.SparkStateReadStore": "org.apache.spark.sql.execution.streaming.state.ReadStateStore",
    "io.sparkstate.shim.MaintenanceWarnings": "org.apache.spark.sql.streaming.StreamingQueryListener",
}


def expected_totals(phase: int) -> dict[str, int]:
    totals: dict[str, int] = {}
    for n in range(1, phase + 1):
        for k, v in EVENTS[n]:
            totals[k] = totals.get(k, 0) + v
    return totals


def running_total(key, pdfs, state):
    """Sums v per key across batches and restarts; emits the new total and the Python running it."""
    import pandas as pd

    (k,) = key
    total = state.get[0] if state.exists else 0
    for pdf in pdfs:
        total += int(pdf["v"].sum())
    state.update((total,))
    yield pd.DataFrame({"k": [k], "total": [total], "python": [sys.executable]})


def contract(spark) -> dict[str, list[str]]:
    """For each shim class: abstract methods left unimplemented against this Spark's interfaces.

    Loads the classes in the running JVM (the Spark version under test) and checks every public
    method (declared or inherited from Spark's traits) for the abstract modifier; also reports a
    class that does not implement its Spark interface.
    """
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    modifier = jvm.java.lang.reflect.Modifier
    problems: dict[str, list[str]] = {}
    for name, interface in SHIM_CLASSES.items():
        cls = jvm.java.lang.Class.forName(name, False, loader)
        found = [m.toString() for m in cls.getMethods() if modifier.isAbstract(m.getModifiers())]
        if not jvm.java.lang.Class.forName(interface, False, loader).isAssignableFrom(cls):
            found.append(f"does not implement {interface}")
        problems[name] = found
    return problems


def history(spark, checkpoint: Path) -> dict:
    """The change feed (Spark's reader and read_changes, as JSON-able rows) and the state replayed from batch 0
    next to the state Spark reads at the last batch."""
    import spark_state

    def plain(rows):
        return sorted((json.dumps(r, sort_keys=True, default=str) for r in rows))

    reader = spark.read.format("statestore")
    feed = reader.option("readChangeFeed", "true").option("changeStartBatchId", 0).load(str(checkpoint))
    replayed = []
    for partition in (0, 1):
        replayed += (spark.read.format("statestore").option("snapshotStartBatchId", 0)
                     .option("snapshotPartitionId", partition).load(str(checkpoint)).collect())
    return {
        "feed": plain(r.asDict(recursive=True) for r in feed.collect()),
        "read_changes": plain(spark_state.read_changes(str(checkpoint)).to_pylist()),
        "replayed": plain(r.asDict(recursive=True) for r in replayed),
        "state": plain(r.asDict(recursive=True) for r in spark.read.format("statestore").load(str(checkpoint)).collect()),
    }


def unique_ids(checkpoint: Path):
    """``stateUniqueIds`` of the checkpoint's last commit log entry (checkpoint format v2), else None."""
    commits = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    if not commits:
        return None
    lines = (checkpoint / "commits" / str(max(commits))).read_text().splitlines()
    return json.loads(lines[1]).get("stateUniqueIds") if len(lines) > 1 else None



def run_query(spark, args, fmt: int | None, events_dir: Path, own_dir: bool) -> dict:
    """Runs the running-total query once (availableNow) with checkpoint format ``fmt`` (set on the session before
    the query starts: Spark records it in the query's offset log); returns what it did to its state."""
    if fmt:
        spark.conf.set("spark.sql.streaming.stateStore.checkpointFormatVersion", str(fmt))
    checkpoint = args.workdir / (f"checkpoint-v{fmt}" if own_dir else "checkpoint")
    outputs: list[dict] = []

    def collect(df, batch_id):
        outputs.extend(row.asDict() for row in df.collect())

    events = spark.readStream.schema("k string, v long").json(str(events_dir))
    query = (events.groupBy("k")
             .applyInPandasWithState(running_total, "k string, total long, python string", "total long",
                                     "update", "NoTimeout")
             .writeStream.outputMode("update").foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return {
        "totals": {row["k"]: row["total"] for row in outputs},   # each key's latest total
        "pythons": sorted({row["python"] for row in outputs}),
        "history": history(spark, checkpoint) if args.phase > 1 else None,
        "unique_ids": unique_ids(checkpoint),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("phase", type=int, choices=sorted(EVENTS))
    parser.add_argument("--configure", action="store_true", help="use spark_state.configure(builder)")
    parser.add_argument("--master", help="master URL (omit under spark-submit)")
    parser.add_argument("--option", action="append", default=[], help="spark_state option key=value")
    parser.add_argument("--checkpoint-format", type=int, choices=(1, 2), nargs="+",
                        help="spark.sql.streaming.stateStore.checkpointFormatVersion (default: Spark's); with "
                             "several, the query runs once per format, each on checkpoint-vN")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    import spark_state

    events_dir = args.workdir / "events"
    events_dir.mkdir(parents=True, exist_ok=True)
    (events_dir / f"part-{args.phase}.json").write_text(
        "".join(json.dumps({"k": k, "v": v}) + "\n" for k, v in EVENTS[args.phase]))

    builder = (SparkSession.builder.appName(f"spark_state wheel app, phase {args.phase}")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2"))
    if args.master:
        builder = builder.master(args.master)
    if args.configure:
        options = dict(o.split("=", 1) for o in args.option)
        builder = spark_state.configure(builder, **options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    # one query per checkpoint format asked for (Spark's default when none), each on a checkpoint of its own
    # when there are several: one application (one JVM start) checks both formats
    formats = args.checkpoint_format or [None]
    queries = {str(fmt or "default"): run_query(spark, args, fmt, events_dir, len(formats) > 1) for fmt in formats}
    result = {
        "spark": spark.version,
        "jar": str(spark_state.shim_jar(build=False)),
        "javac": shutil.which("javac"),
        "provider": spark.conf.get("spark.sql.streaming.stateStore.providerClass", None),
        "contract": contract(spark),
        "listeners": sorted(l.getClass().getName() for l in spark._jsparkSession.streams().listListeners()),
        "python_version": "%d.%d" % sys.version_info[:2],
        "pid": os.getpid(),
        **next(iter(queries.values())),   # the first (usually only) query's, at the top as before
        "queries": queries,
    }
    spark.stop()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
