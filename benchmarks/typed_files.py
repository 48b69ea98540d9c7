"""Typed state files (file format 2): checkpoint bytes, commit and restore beside HDFS, RocksDB and
spark_state's own file format 1, in one run, on two data sets.

    flock /work/wt/spark.lock .venv/bin/python -m benchmarks.typed_files [--rows 1000000] [--out DIR]

Data sets (``benchmarks/jvm/ProviderBench.java --data``):

* ``bench``: the main benchmark's rows, key ``long``, value ``(long, long, double, int, string16)``;
* ``sessions``: what ``applyInPandasWithState`` keeps per user: key ``user-%08d``, value
  ``(groupState: (session id, clicks, purchases, first/last seen timestamps, last page, country),
  timeoutTimestamp)``.

Each (data set, provider) writes B batches (all keys, then B-1 batches changing 10% of them, then
maintenance) in a fresh JVM, and a second fresh JVM restores the latest version, as in
``benchmarks.run``'s checkpoint scenario. Writes ``typed_files.md`` and ``typed_files.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from benchmarks import jvm_bench
from benchmarks.providers import all_providers, spark_state_status

PROVIDERS = ("hdfs", "rocksdb", "spark_state_fs_f1", "spark_state_fs")
DATA = ("bench", "sessions")


def measure(provider, data: str, rows: int, batches: int, work: Path, logs: Path, shim_jar) -> dict:
    d = work / f"{data}-{provider.name}"
    shutil.rmtree(d, ignore_errors=True)
    w = jvm_bench.run(provider, "write", rows, d, logs / f"write-{data}-{provider.name}.log", shim_jar=shim_jar,
                      batches=batches, change_pct=10.0, data=data)
    r = jvm_bench.run(provider, "restore", rows, d, logs / f"restore-{data}-{provider.name}.log",
                      shim_jar=shim_jar, version=w["version"], data=data)
    shutil.rmtree(d, ignore_errors=True)
    commits = w["commit_ms"][1:] or w["commit_ms"]
    if r.get("num_keys") not in (None, -1, rows) or not r.get("found", True):
        raise RuntimeError(f"{provider.name} {data}: restored {r.get('num_keys')} keys, expected {rows}")
    return {"bytes": w["checkpoint_bytes"], "files": w["checkpoint_files"], "first_commit_ms": w["commit_ms"][0],
            "commit_ms": sum(commits) / len(commits), "restore_ms": r["restore_ms"]}


def report(results: dict, rows: int, batches: int) -> str:
    lines = [f"# Typed state files: {rows:,} keys, {batches} batches (10% of keys changed per batch after the first)",
             "", "spark_state = file format 2 (typed columns), the default; f1 = the same provider writing file "
             "format 1 (opaque UnsafeRow bytes), in the same run.", ""]
    for data, by in results.items():
        ours = by.get("spark_state_fs")
        lines += [f"## data set `{data}`", "",
                  "| provider | bytes on disk | files | commit batch 1 (ms) | commit, mean 2..B (ms) | restore (ms) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, m in by.items():
            lines.append(f"| {name} | {m['bytes']:,} | {m['files']} | {m['first_commit_ms']:.0f} | "
                         f"{m['commit_ms']:.1f} | {m['restore_ms']:.0f} |")
        if ours:
            lines += ["", "| spark_state ÷ | bytes | commit batch 1 | commit 2..B | restore |", "|---|---:|---:|---:|---:|"]
            for name, m in by.items():
                if name == "spark_state_fs":
                    continue
                lines.append(f"| {name} | {ours['bytes'] / m['bytes']:.2f}× | "
                             f"{ours['first_commit_ms'] / m['first_commit_ms']:.2f}× | "
                             f"{ours['commit_ms'] / m['commit_ms']:.2f}× | {ours['restore_ms'] / m['restore_ms']:.2f}× |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--data", default=",".join(DATA))
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/typed"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    jvm_bench.compile_harness()
    shim_jar, why = spark_state_status(build=True)
    if shim_jar is None:
        print(f"spark_state not available: {why}", file=sys.stderr)
        return 2
    providers = {p.name: p for p in all_providers()}
    results: dict = {}
    for data in args.data.split(","):
        for name in args.providers.split(","):
            m = measure(providers[name], data, args.rows, args.batches, args.out / "work", logs, shim_jar)
            results.setdefault(data, {})[name] = m
            print(f"{data} {name}: {json.dumps(m)}", flush=True)
            (args.out / "typed_files.json").write_text(json.dumps(results, indent=1))
            (args.out / "typed_files.md").write_text(report(results, args.rows, args.batches))
    shutil.rmtree(args.out / "work", ignore_errors=True)
    print(report(results, args.rows, args.batches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
