"""End-to-end streaming benchmarks through PySpark, one provider per process.

    python -m benchmarks.e2e --provider hdfs --scenario agg --data DIR --workdir DIR

prints one line ``RESULT {json}`` with the per-batch progress of the query.
``benchmarks.run`` starts one such process per (provider, scenario), so every
provider gets a fresh SparkSession (and JVM) on the same input files.

Scenarios:
  agg     state-heavy: groupBy(key).agg(count, sum, max), update mode, many keys
  pandas  UDF-heavy: groupBy(key).applyInPandasWithState(running count and sum)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_data(data_dir: Path, *, files: int, rows_per_file: int, keys: int, seed: int = 5) -> None:
    """`files` parquet files of `rows_per_file` rows (key uniform in [0, keys), value double)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    stamp = data_dir / "_SPEC"
    spec = f"{files} {rows_per_file} {keys} {seed}"
    if stamp.exists() and stamp.read_text() == spec:
        return
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(files):
        table = pa.table({
            "key": rng.integers(0, keys, rows_per_file, dtype=np.int64),
            "v": rng.random(rows_per_file),
        })
        pq.write_table(table, data_dir / f"part-{i:05d}.parquet")
        # the file source orders files by modification time
        t = time.time() - (files - i)
        os.utime(data_dir / f"part-{i:05d}.parquet", (t, t))
    stamp.write_text(spec)


def _session(provider, *, partitions: int, driver_memory: str):
    from pyspark.sql import SparkSession

    # PySpark starts its Python workers with PYSPARK_PYTHON (default "python3"), not this interpreter
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (SparkSession.builder.master("local[2]")
               .appName(f"spark_state-bench-{provider.name}")
               .config("spark.sql.shuffle.partitions", str(partitions))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.pyspark.driver.python", sys.executable)
               .config("spark.driver.memory", driver_memory)
               .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={HERE / 'jvm' / 'log4j2.properties'}"))
    if provider.spark_state:
        import spark_state
        from benchmarks.providers import BENCH_MEMORY_MAX_STATE_SIZE, SS

        kwargs = {"storage": provider.storage, "python": sys.executable}
        if provider.confs.get(SS + "prestartWorker") == "false":
            kwargs["prestart_worker"] = False
        if provider.storage == "memory":
            kwargs["memory_max_state_size"] = BENCH_MEMORY_MAX_STATE_SIZE
        builder = spark_state.configure(builder, **kwargs)
    else:
        for k, v in provider.sql_confs().items():
            builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _state_fn(key, pdfs, state):
    import pandas as pd

    count, total = state.get if state.exists else (0, 0.0)
    for pdf in pdfs:
        count += len(pdf)
        total += float(pdf["v"].sum())
    state.update((count, total))
    yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})


def run_query(provider, scenario: str, data_dir: Path, workdir: Path, *, partitions: int,
              driver_memory: str) -> dict:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ckpt = workdir / "checkpoint"
    spark = _session(provider, partitions=partitions, driver_memory=driver_memory)
    try:
        src = (spark.readStream.schema("key long, v double").option("maxFilesPerTrigger", 1)
               .parquet(str(data_dir)))
        if scenario == "agg":
            out = src.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.max("v").alias("m"))
        elif scenario == "pandas":
            out = src.groupBy("key").applyInPandasWithState(
                _state_fn, outputStructType="key long, count long, total double",
                stateStructType="count long, total double", outputMode="update",
                timeoutConf=GroupStateTimeout.NoTimeout)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        t0 = time.perf_counter()
        q = (out.writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        q.awaitTermination()
        wall = time.perf_counter() - t0
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        batches = []
        for p in q.recentProgress:
            ops = p.stateOperators or []
            batches.append({
                "batch": p.batchId,
                "rows": p.numInputRows,
                "trigger_ms": p.durationMs.get("triggerExecution", 0),
                "add_batch_ms": p.durationMs.get("addBatch", 0),
                "commit_ms": sum(o.commitTimeMs for o in ops),
                "state_rows": sum(o.numRowsTotal for o in ops),
                "state_memory_bytes": sum(o.memoryUsedBytes for o in ops),
            })
    finally:
        spark.stop()
    state_bytes = state_files = 0
    for root, _dirs, files in os.walk(ckpt / "state"):
        for f in files:
            state_files += 1
            state_bytes += os.path.getsize(os.path.join(root, f))
    return {"provider": provider.name, "scenario": scenario, "partitions": partitions, "wall_s": wall,
            "batches": batches, "state_bytes": state_bytes, "state_files": state_files}


def summarize(result: dict) -> dict:
    """rows/s over the batches after the first (warm-up: JIT, worker start), and the commit share."""
    batches = [b for b in result["batches"] if b["rows"] > 0]
    steady = batches[1:] or batches
    rows = sum(b["rows"] for b in steady)
    trig = sum(b["trigger_ms"] for b in steady)
    commit = sum(b["commit_ms"] for b in steady)
    add = sum(b["add_batch_ms"] for b in steady)
    return {
        "rows_per_s": rows / (trig / 1000) if trig else None,
        "rows_per_s_all": (sum(b["rows"] for b in batches) / (sum(b["trigger_ms"] for b in batches) / 1000)
                           if batches else None),
        "batch_ms": trig / len(steady) if steady else None,
        "first_batch_ms": batches[0]["trigger_ms"] if batches else None,
        "commit_ms_per_batch": commit / len(steady) if steady else None,
        "commit_share": commit / trig if trig else None,
        "commit_share_of_add_batch": commit / add if add else None,
        "state_rows": batches[-1]["state_rows"] if batches else None,
        "state_bytes": result["state_bytes"],
        "state_files": result["state_files"],
        "num_batches": len(batches),
    }


def main(argv=None) -> int:
    from benchmarks.providers import all_providers

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--provider", required=True)
    ap.add_argument("--scenario", required=True, choices=["agg", "pandas"])
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--driver-memory", default="2g")
    args = ap.parse_args(argv)
    provider = {p.name: p for p in all_providers()}[args.provider]
    result = run_query(provider, args.scenario, args.data, args.workdir, partitions=args.partitions,
                       driver_memory=args.driver_memory)
    result["summary"] = summarize(result)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
