"""Rescale benchmark: spark_state's metadata-only rescale beside Spark's own offline repartition
(``spark._streamingCheckpointManager.repartition``, Spark 4.2+) of the same state, in the same run.

    python -m benchmarks.rescale                 # 1M keys, 4 -> 8 partitions (the default profile)
    python -m benchmarks.rescale --quick         # 100k keys
    python -m benchmarks.rescale --full          # 1M and 10M keys
    python -m benchmarks.rescale --keys 2000000 --from 4 --to 3 --providers spark_state_fs,rocksdb

For each provider, in its own PySpark process (fresh JVM): one streaming aggregation
(``groupBy(key).agg(count, sum)``, one row of state per key) over ``keys`` distinct keys with
``--from`` shuffle partitions, stopped; then the rescale to ``--to`` partitions, timed alone, with
the bytes it wrote (files new or changed in the checkpoint, by walking it before and after); then
the query restarted on a small new file (1% of the keys), timed, checking it runs with the new
partition count and still holds every key. Writes ``rescale.md`` and ``rescale.json`` into
``--out`` (default ``benchmarks/out/``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Spark's repartition supports RocksDB only (hdfs: STATE_REPARTITION_INVALID_CHECKPOINT.UNSUPPORTED_PROVIDER);
#: pass --providers spark_state_fs,rocksdb,hdfs to see that in the report.
PROVIDERS = ("spark_state_fs", "rocksdb")


def _data(data_dir: Path, keys: int, seed: int = 11) -> None:
    """Every key once (the initial state), in 4 parquet files; the restart file comes later."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    stamp = data_dir / "_SPEC"
    if stamp.exists() and stamp.read_text() == f"{keys} {seed}":
        return
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(keys).astype(np.int64)
    for i, part in enumerate(np.array_split(order, 4)):
        pq.write_table(pa.table({"key": part, "v": rng.random(len(part))}), data_dir / f"part-{i:05d}.parquet")
        t = time.time() - (10 - i)
        os.utime(data_dir / f"part-{i:05d}.parquet", (t, t))
    stamp.write_text(f"{keys} {seed}")


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for base, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(base, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def _written(before: dict, after: dict) -> tuple[int, int]:
    """(bytes, files) of files that are new or changed."""
    changed = [p for p, sig in after.items() if before.get(p) != sig]
    return sum(after[p][0] for p in changed), len(changed)


def child(provider_name: str, keys: int, n_from: int, n_to: int, data_dir: Path, workdir: Path) -> dict:
    from pyspark.sql import functions as F

    from benchmarks.e2e import _session
    from benchmarks.providers import all_providers

    provider = {p.name: p for p in all_providers()}[provider_name]
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ckpt = workdir / "checkpoint"
    input_dir = workdir / "input"
    input_dir.mkdir()
    for f in sorted(data_dir.glob("part-*.parquet")):
        try:
            os.link(f, input_dir / f.name)
        except OSError:
            shutil.copy(f, input_dir / f.name)
        os.utime(input_dir / f.name, (os.stat(f).st_mtime, os.stat(f).st_mtime))
    spark = _session(provider, partitions=n_from, driver_memory="4g")
    result: dict = {"provider": provider.name, "label": provider.label, "keys": keys, "from": n_from, "to": n_to}

    def run_query() -> tuple[float, list]:
        src = spark.readStream.schema("key long, v double").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
        out = src.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        t0 = time.perf_counter()
        q = (out.writeStream.outputMode("update").format("noop").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        return time.perf_counter() - t0, q.recentProgress

    try:
        load_s, progress = run_query()
        result["load_s"] = load_s
        result["state_rows"] = sum(o.numRowsTotal for o in progress[-1].stateOperators)
        before = _snapshot(ckpt)
        result["state_bytes_before"] = sum(size for p, (size, _) in before.items() if "/state/" in p)

        t0 = time.perf_counter()
        if provider.spark_state:
            import spark_state

            r = spark_state.rescale(str(ckpt), n_to)
            result["reported_bytes_written"] = r.bytes_written
            result["rescale_method"] = "spark_state.rescale (metadata only)"
        else:
            spark._streamingCheckpointManager.repartition(str(ckpt), n_to)
            result["rescale_method"] = "spark._streamingCheckpointManager.repartition"
        result["rescale_s"] = time.perf_counter() - t0
        after = _snapshot(ckpt)
        result["bytes_written"], result["files_written"] = _written(before, after)

        # Restart on 1% of the keys: the first batch loads the rescaled state.
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        touched = np.random.default_rng(3).choice(keys, max(1, keys // 100), replace=False).astype(np.int64)
        pq.write_table(pa.table({"key": touched, "v": np.ones(len(touched))}), input_dir / "part-99999.parquet")
        restart_s, progress = run_query()
        last = progress[-1]
        result["restart_batch_s"] = restart_s
        result["restart_trigger_ms"] = last.durationMs.get("triggerExecution", 0)
        result["state_rows_after"] = sum(o.numRowsTotal for o in last.stateOperators)
        commits = sorted(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
        conf = json.loads((ckpt / "offsets" / str(commits[-1])).read_text().splitlines()[1])["conf"]
        result["partitions_after"] = int(conf["spark.sql.shuffle.partitions"])
        parts = {p.name for p in (ckpt / "state" / "0").iterdir() if p.name.isdigit()}
        result["state_partition_dirs"] = len(parts)
        if result["partitions_after"] != n_to:
            raise RuntimeError(f"the restarted query runs with {result['partitions_after']} partitions, not {n_to}")
        if result["state_rows_after"] != keys:
            raise RuntimeError(f"the restarted query holds {result['state_rows_after']} keys, not {keys}")
    finally:
        spark.stop()
    return result


def _table(results: list[dict]) -> str:
    lines = ["| keys | provider | how | rescale s | bytes written | files written | first batch after (s) | "
             "state before (bytes) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['keys']:,} | {r['provider']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['keys']:,} | {r['label']} | {r['rescale_method']} | {r['rescale_s']:.2f} | "
                     f"{r['bytes_written']:,} | {r['files_written']} | {r['restart_batch_s']:.2f} | "
                     f"{r['state_bytes_before']:,} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--provider", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, action="append", help="distinct keys of state (repeatable)")
    parser.add_argument("--quick", action="store_true", help="100k keys")
    parser.add_argument("--full", action="store_true", help="1M and 10M keys")
    parser.add_argument("--from", dest="n_from", type=int, default=4)
    parser.add_argument("--to", dest="n_to", type=int, default=8)
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--out", default=str(HERE / "out"))
    args = parser.parse_args(argv)
    if args.child:
        r = child(args.provider, args.keys[0], args.n_from, args.n_to, Path(args.out), Path(args.workdir))
        print("RESULT " + json.dumps(r), flush=True)
        return 0

    from benchmarks.jvm_bench import run_for_result

    sizes = args.keys or ([100_000] if args.quick else [1_000_000, 10_000_000] if args.full else [1_000_000])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for keys in sizes:
        data = out / "data" / f"rescale-{keys}"
        _data(data, keys)
        for name in args.providers.split(","):
            work = out / "work" / f"rescale-{name}-{keys}"
            cmd = [sys.executable, "-m", "benchmarks.rescale", "--child", "--provider", name, "--keys", str(keys),
                   "--from", str(args.n_from), "--to", str(args.n_to), "--out", str(data), "--workdir", str(work)]
            t0 = time.perf_counter()
            try:
                r = run_for_result(cmd, out / "logs" / f"rescale-{name}-{keys}.log", f"rescale {name} {keys}",
                                   timeout=7200, cwd=ROOT)
            except Exception as err:  # noqa: BLE001 - a failed provider is reported, the others still run
                log = (out / "logs" / f"rescale-{name}-{keys}.log").read_text(errors="replace").splitlines()
                msg = str(err).strip().splitlines()
                why = next((ln for ln in log if re.search(r"(Error|Exception): ", ln)), msg[-1] if msg else "")
                r = {"provider": name, "keys": keys, "error": why.strip()[:300]}
            r["process_s"] = time.perf_counter() - t0
            results.append(r)
            print(json.dumps(r), flush=True)
            shutil.rmtree(work, ignore_errors=True)
            (out / "rescale.json").write_text(json.dumps(results, indent=1))
    table = _table(results)
    (out / "rescale.md").write_text(f"# Rescale {args.n_from} -> {args.n_to} partitions\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
