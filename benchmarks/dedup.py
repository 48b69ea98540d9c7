"""Deduplication lookups after a restart (issue 37): Spark 4.2+'s ``keyExists`` and ``multiGet`` beside the
``get(key) != null`` Spark falls back to, on a restored state of N keys (1M by default).

For each provider: one JVM writes the state (ProviderBench mode ``write``, one batch, background work
finished), another restores it on fresh providers and looks up N/10 keys, half of them present, three ways
(ProviderBench mode ``dedup``: ``before`` = ``get != null``, ``after`` = ``keyExists``, ``multiget`` =
``multiGet`` in chunks of 1024), each on its own fresh restore, twice; medians. The executor heap users give
two cores (1 GiB) is the JVM's heap.

    python -m benchmarks.dedup [--rows 1000000] [--providers spark_state_fs,rocksdb] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
from pathlib import Path

from benchmarks import jvm_bench
from benchmarks.providers import all_providers, spark_state_status

OUT = Path(__file__).resolve().parent / "results" / "dedup"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--providers", default="spark_state_fs,rocksdb")
    parser.add_argument("--heap", default="1g")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    jar, why = spark_state_status()
    providers = {p.name: p for p in all_providers()}
    results = []
    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as work:
        for name in args.providers.split(","):
            provider = providers[name]
            if provider.spark_state and jar is None:
                raise SystemExit(f"spark_state cannot run: {why}")
            ckpt = Path(work) / name
            heap = [f"-Xmx{args.heap}"]
            written = jvm_bench.run(provider, "write", args.rows, ckpt, Path(work) / f"{name}-write.log",
                                    shim_jar=jar, batches=1, extra_jvm=heap)
            looked = jvm_bench.run(provider, "dedup", args.rows, ckpt, Path(work) / f"{name}-dedup.log",
                                   shim_jar=jar, version=written["version"], extra_jvm=heap)
            results.append({"provider": name, "label": provider.label, **looked})
            print(json.dumps(results[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"rows": args.rows, "heap": args.heap, "git": commit, "cpus": platform.machine()}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    lines = [f"# Deduplication lookups after a restart ({args.rows:,} keys, -Xmx{args.heap}, git {commit})", "",
             f"`python -m benchmarks.dedup --rows {args.rows}`: {results[0]['lookups']:,} lookups, half of them "
             f"present, on a freshly restored store (no block cached; `open`: its first get, timed apart); median of 2 runs.",
             "",
             "| provider | open (ms) | before: `get != null` (ms) | after: `keyExists` (ms) | "
             "`multiGet`, 1024 a call (ms) | `keyExists` again, warm (ms) | found |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['label']} | {r['open_ms']:.0f} | {r['before_ms']:.0f} | {r['after_ms']:.0f} | "
                     f"{r['multiget_ms']:.0f} | {r['warm_ms']:.0f} | {r['found']:,} |")
    if len(results) == 2:
        a, b = results
        lines += ["", f"Ratios, {a['label']} ÷ {b['label']}: open {a['open_ms'] / b['open_ms']:.2f}×, "
                      f"`keyExists` {a['after_ms'] / b['after_ms']:.2f}×, `multiGet` "
                      f"{a['multiget_ms'] / b['multiget_ms']:.2f}×, warm {a['warm_ms'] / b['warm_ms']:.2f}×."]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
