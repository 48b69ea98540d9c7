"""Row images in the JVM (issue 23): write, open, cold and warm gets, full iteration and heap, beside
RowArena.get on the same rows (benchmarks/jvm/RowImageBench.java, one JVM per size).

    flock /work/spark.lock .venv/bin/python -m benchmarks.rowimage [--rows 1000000 10000000] [--out DIR]

Writes ``rowimage.json`` into ``--out`` (default benchmarks/results) and prints one line per size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks import jvm_bench
from spark_state.spark import shim

SOURCE = jvm_bench.HERE / "jvm" / "RowImageBench.java"
BUILD = jvm_bench.HERE / "jvm" / "build" / "rowimage"


def compile_bench(jar: Path) -> Path:
    """javac RowImageBench.java (package io.sparkstate.shim) against the shim jar and pyspark's jars."""
    BUILD.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(BUILD), "-cp",
                           f"{jar}{os.pathsep}{jvm_bench.JARS}/*", str(SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"javac RowImageBench.java failed:\n{proc.stderr}")
    return BUILD


def run(rows: int, work: Path, logs: Path, block_bytes: int) -> dict:
    jar = shim.shim_jar()
    cp = os.pathsep.join([str(compile_bench(jar)), str(jar), f"{jvm_bench.JARS}/*"])
    cmd = ["java", f"-Xmx{jvm_bench.heap_for(rows)}", *jvm_bench.JAVA_OPENS, "-cp", cp,
           "io.sparkstate.shim.engine.RowImageBench", "--rows", str(rows), "--dir", str(work),
           "--block-bytes", str(block_bytes)]
    try:
        return jvm_bench.run_for_result(cmd, logs / f"rowimage-{rows}.log", f"RowImageBench rows={rows}", timeout=3600)
    finally:
        (work / f"bench-{rows}.rimg").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--block-bytes", type=int, default=4096, help="raw bytes per block (the spec's default: 4 KiB)")
    ap.add_argument("--out", type=Path, default=jvm_bench.HERE / "results")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="rowimage-bench-") as tmp:
        for rows in args.rows:
            r = run(rows, Path(tmp), jvm_bench.HERE / "out" / "rowimage", args.block_bytes)
            results.append(r)
            print(f"{rows:>10,} rows: write {r['write_s']} s, {r['file_bytes_per_row']} B/row on disk, "
                  f"open {r['open_ms_median_of_5']} ms, heap {r['open_image_heap_bytes_per_row']} B/row; "
                  f"get cold p50 {r['cold_get_us_p50']} us, warm {r['warm_get_ns']} ns "
                  f"(hit rate {r['warm_get_hit_rate']}), all cached {r['all_cached_get_ns']} ns, "
                  f"arena {r['arena_get_ns']} ns; iterate {r['iterate_rows_per_s']:,} rows/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rowimage.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
