"""Migration benchmark: time and peak memory of ``spark_state.migrate`` between Spark's providers and
spark_state, on the state of one streaming aggregation.

    python -m benchmarks.migrate                          # 1M keys: hdfs, rocksdb -> spark_state; spark_state -> hdfs
    python -m benchmarks.migrate --keys 10000000 --directions rocksdb:spark_state,spark_state_fs:hdfs
    python -m benchmarks.migrate --quick                  # 100k keys

For each direction, two PySpark processes (fresh JVMs, ``local[2]``, 4 GiB driver heap):

1. **source**: ``groupBy(key).agg(count, sum)`` over ``--keys`` distinct keys (4 parquet files, one per
   batch) with ``--partitions`` shuffle partitions on the source provider, then stopped;
2. **migrate**: a new session, ``spark_state.migrate(checkpoint, target, to)`` timed alone while a thread
   samples the resident memory (RSS) of every process of the migration every 50 ms: this Python (the
   driver), the JVM (driver and executor: Spark's reader, the HDFS provider's writer) and its children
   (PySpark's workers, which write spark_state's files, and spark_state's worker, which the shim reads
   with). The peaks are reported per kind and for the sum at one moment; the JVM's RSS before the
   migration is its idle baseline. Then the query restarts on the target with a new file touching 1% of
   the keys and must hold every key (the migration is checked, not only timed).

Writes ``migrate.md`` and ``migrate.json`` into ``--out`` (default ``benchmarks/out/``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DIRECTIONS = ("hdfs:spark_state", "rocksdb:spark_state", "spark_state_fs:hdfs")


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry.name))
    return out


class MemorySampler:
    """Peak RSS of this process, its JVM child and the JVM's descendants (Python workers), sampled."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = {"driver_python": 0, "jvm": 0, "python_workers": 0, "total": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[int, int]:
        tree = _children()
        me = os.getpid()
        jvms = [p for p in tree.get(me, []) if "java" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        workers, todo = [], [c for j in jvms for c in tree.get(j, [])]
        while todo:
            pid = todo.pop()
            workers.append(pid)
            todo.extend(tree.get(pid, []))
        now = {"driver_python": _rss(me), "jvm": sum(_rss(p) for p in jvms),
               "python_workers": sum(_rss(p) for p in workers)}
        now["total"] = sum(now.values())
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for k, v in self.sample().items():
                self.peak[k] = max(self.peak[k], v)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _data(data_dir: Path, keys: int, seed: int = 11) -> None:
    from benchmarks.rescale import _data as rescale_data

    rescale_data(data_dir, keys, seed)


def _session(provider_name: str, partitions: int):
    from benchmarks.e2e import _session as bench_session
    from benchmarks.providers import all_providers

    provider = {p.name: p for p in all_providers()}[provider_name]
    return bench_session(provider, partitions=partitions, driver_memory="4g")


def _run_query(spark, input_dir: Path, ckpt: Path, provider_conf: dict):
    from pyspark.sql import functions as F

    for k, v in provider_conf.items():
        spark.conf.set(k, v)
    src = spark.readStream.schema("key long, v double").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    out = src.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    t0 = time.perf_counter()
    q = (out.writeStream.outputMode("update").format("noop").option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return time.perf_counter() - t0, q.recentProgress


def child_source(source: str, keys: int, partitions: int, data_dir: Path, workdir: Path) -> dict:
    from benchmarks.providers import all_providers

    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "input").mkdir(parents=True)
    for f in sorted(data_dir.glob("part-*.parquet")):
        os.link(f, workdir / "input" / f.name)
        os.utime(workdir / "input" / f.name, (os.stat(f).st_mtime, os.stat(f).st_mtime))
    spark = _session(source, partitions)
    provider = {p.name: p for p in all_providers()}[source]
    try:
        load_s, progress = _run_query(spark, workdir / "input", workdir / "source", provider.sql_confs())
    finally:
        spark.stop()
    rows = sum(o.numRowsTotal for o in progress[-1].stateOperators)
    state_bytes = sum(p.stat().st_size for p in (workdir / "source" / "state").rglob("*") if p.is_file())
    return {"source_build_s": load_s, "state_rows": rows, "source_state_bytes": state_bytes}


def child_migrate(source: str, to: str, keys: int, partitions: int, workdir: Path) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import spark_state

    spark = _session("spark_state_fs", partitions)   # the spark_state jar in the session; the offset logs pick providers
    result: dict = {}
    try:
        sampler = MemorySampler()
        result["rss_before"] = sampler.sample()
        target = workdir / "target"
        with sampler:
            t0 = time.perf_counter()
            r = spark_state.migrate(str(workdir / "source"), str(target), to)
            result["migrate_s"] = time.perf_counter() - t0
        result["peak_rss"] = sampler.peak
        result.update(rows=r.rows, bytes_written=r.bytes, store_partitions=r.stores, batch=r.batch)
        result["target_state_bytes"] = sum(p.stat().st_size for p in (target / "state").rglob("*") if p.is_file())
        if r.rows != keys:
            raise RuntimeError(f"migrated {r.rows} rows, the source holds {keys} keys")
        touched = np.random.default_rng(3).choice(keys, max(1, keys // 100), replace=False).astype(np.int64)
        pq.write_table(pa.table({"key": touched, "v": np.ones(len(touched))}), workdir / "input" / "part-99999.parquet")
        restart_s, progress = _run_query(spark, workdir / "input", target, {})
        result["restart_batch_s"] = restart_s
        result["state_rows_after"] = sum(o.numRowsTotal for o in progress[-1].stateOperators)
        if result["state_rows_after"] != keys:
            raise RuntimeError(f"the query restarted on the target holds {result['state_rows_after']} keys, not {keys}")
    finally:
        spark.stop()
    return result


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def _table(results: list[dict]) -> str:
    lines = ["| keys | from | to | partitions | migrate s | rows/s | peak RSS total MiB | JVM MiB (idle before) | "
             "Python workers MiB | driver Python MiB | state bytes before → after | restart batch s |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['keys']:,} | {r['from']} | {r['to']} | | failed: {r['error']} | | | | | | | |")
            continue
        peak, idle = r["peak_rss"], r["rss_before"]
        lines.append(
            f"| {r['keys']:,} | {r['from']} | {r['to']} | {r['partitions']} | {r['migrate_s']:.1f} | "
            f"{r['keys'] / r['migrate_s']:,.0f} | {_mib(peak['total'])} | {_mib(peak['jvm'])} ({_mib(idle['jvm'])}) | "
            f"{_mib(peak['python_workers'])} | {_mib(peak['driver_python'])} | "
            f"{r['source_state_bytes']:,} → {r['target_state_bytes']:,} | {r['restart_batch_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=("source", "migrate"), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, action="append", help="distinct keys of state (repeatable)")
    parser.add_argument("--quick", action="store_true", help="100k keys")
    parser.add_argument("--partitions", type=int, default=8, help="shuffle partitions of the query (default 8)")
    parser.add_argument("--directions", default=",".join(DIRECTIONS), help="source:target pairs, comma-separated")
    parser.add_argument("--out", default=str(HERE / "out"))
    args = parser.parse_args(argv)
    if args.child:
        source, to = args.directions.split(":")
        if args.child == "source":
            r = child_source(source, args.keys[0], args.partitions, Path(args.data), Path(args.workdir))
        else:
            r = child_migrate(source, to, args.keys[0], args.partitions, Path(args.workdir))
        print("RESULT " + json.dumps(r), flush=True)
        return 0

    from benchmarks.jvm_bench import run_for_result

    sizes = args.keys or ([100_000] if args.quick else [1_000_000])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for keys in sizes:
        data = out / "data" / f"rescale-{keys}"
        _data(data, keys)
        for direction in args.directions.split(","):
            source, to = direction.split(":")
            name = f"migrate-{source}-{to}-{keys}"
            work = out / "work" / name
            r: dict = {"keys": keys, "from": source, "to": to, "partitions": args.partitions}
            base = [sys.executable, "-m", "benchmarks.migrate", "--keys", str(keys), "--partitions",
                    str(args.partitions), "--directions", direction, "--workdir", str(work)]
            try:
                r.update(run_for_result(base + ["--child", "source", "--data", str(data)],
                                        out / "logs" / f"{name}-source.log", f"{name} source", timeout=7200, cwd=ROOT))
                r.update(run_for_result(base + ["--child", "migrate"], out / "logs" / f"{name}.log", name,
                                        timeout=7200, cwd=ROOT))
            except Exception as err:  # noqa: BLE001 - a failed direction is reported, the others still run
                r["error"] = str(err).strip().splitlines()[-1][:300]
            results.append(r)
            print(json.dumps(r), flush=True)
            shutil.rmtree(work, ignore_errors=True)
            (out / "migrate.json").write_text(json.dumps(results, indent=1))
    table = _table(results)
    (out / "migrate.md").write_text(f"# Migration between providers\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
