"""Row images (issue 23): how fast the worker encodes one from a typed table, and its bytes beside the
typed snapshot of the same rows, on the two data sets of ``benchmarks.typed_files``.

    .venv/bin/python -m benchmarks.row_images [--rows 1000000] [--repeat 3] [--out DIR]

Pure Python, no JVM (it needs no lock). Rows are built as ``benchmarks/jvm/ProviderBench.java`` makes
them, as the typed table a compaction holds after reading (``kg, hash, key, value``):

* ``bench``: key ``k: long``; value ``(a: long, b: long, c: double, d: int, s: string16)``, ``s`` from a
  pool of 1024 random 16-letter words;
* ``sessions``: key ``user: "user-%08d"``; value ``(groupState: (session_id, clicks, purchases,
  first_seen, last_seen, last_page, country), timeoutTimestamp)``.

Hashes are random int32 (what Murmur3 gives), key groups ``pmod(hash, 100800)``, rows in key-group
order as a typed snapshot holds them. Reported per data set: the best of ``--repeat`` runs of
``rowimage.encode`` (zstd level 1, 4 KiB blocks; single-threaded and with 2 compression threads),
its parts (UnsafeRow encoding of keys and values alone, the zstd pass alone), bytes per row of the
image, of its raw records and of ``datafile.encode`` (the typed snapshot, zstd 3, dictionaries), and
the snapshot's own encode time. Writes ``row_images.md`` and ``row_images.json`` into ``--out``
(default ``benchmarks/out/``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import zstandard

from spark_state.format import datafile
from spark_state.format import rowimage, unsaferow

MAX_PARALLELISM = 100800
PAGES = ["/", "/home", "/cart", "/checkout", "/search", "/product/1042", "/product/77", "/product/310", "/account",
         "/help", "/category/shoes", "/category/books"]
COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP", "NL", "ES", "IT", "CA", "PL"]
EPOCH_US = 1_767_225_600_000_000   # 2026-01-01T00:00:00Z


def _keyed(n: int, key: pa.StructArray, value: pa.StructArray, seed: int) -> pa.Table:
    """kg, hash, key, value in key-group order, as a typed snapshot holds its rows."""
    h = np.random.default_rng(seed).integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)
    kg = np.mod(h.astype(np.int64), MAX_PARALLELISM).astype(np.int32)
    table = pa.table({"kg": kg, "hash": h, "key": key, "value": value})
    return table.take(pa.array(np.argsort(kg, kind="stable")))


def bench_rows(n: int, gen: int = 1) -> pa.Table:
    i = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(7)
    pool = np.array(["".join(chr(97 + c) for c in rng.integers(0, 26, 16)) for _ in range(1024)])
    key = pa.StructArray.from_arrays([pa.array(i)], fields=[pa.field("k", pa.int64(), False)])
    value = pa.StructArray.from_arrays(
        [pa.array(i), pa.array(i * 31 + gen), pa.array(i * 0.5), pa.array(np.full(n, gen, np.int32)),
         pa.array(pool).take(pa.array((i + gen) & 1023))],
        fields=[pa.field(name, t, False) for name, t in
                [("a", pa.int64()), ("b", pa.int64()), ("c", pa.float64()), ("d", pa.int32()), ("s", pa.string())]])
    return _keyed(n, key, value, seed=1)


def sessions_rows(n: int, gen: int = 1) -> pa.Table:
    i = np.arange(n, dtype=np.int64)
    h = ((i * np.int64(-7046029254386353131)) ^ gen).view(np.uint64)   # (i * 0x9E3779B97F4A7C15L) ^ gen
    first = EPOCH_US + (i % 86_400) * 1_000_000
    last = first + gen * 45_000_000 + (h & np.uint64(0xFFFF)).astype(np.int64) * 1000
    session = np.char.mod("%x", ((h >> np.uint64(16)) & np.uint64(0xFFFFFFFFFFF)).astype(np.int64))
    state = pa.StructArray.from_arrays(
        [pa.array(session), pa.array(gen * 3 + i % 7), pa.array(((i + gen) % 3 == 0).astype(np.int64)),
         pa.array(first).view(pa.timestamp("us", tz="UTC")), pa.array(last).view(pa.timestamp("us", tz="UTC")),
         pa.array(PAGES).take(pa.array((i + gen) % len(PAGES))), pa.array(COUNTRIES).take(pa.array(i % len(COUNTRIES)))],
        names=["session_id", "clicks", "purchases", "first_seen", "last_seen", "last_page", "country"])
    value = pa.StructArray.from_arrays([state, pa.array(last // 1000 + 1_800_000)],
                                       fields=[pa.field("groupState", state.type, True),
                                               pa.field("timeoutTimestamp", pa.int64(), False)])
    key = pa.StructArray.from_arrays([pa.array(np.char.mod("user-%08d", i))], names=["user"])
    return _keyed(n, key, value, seed=2)


def _best(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def measure(name: str, table: pa.Table, repeat: int) -> dict:
    n = table.num_rows
    t_image, image = _best(lambda: rowimage.encode(table), repeat)
    t_image2, image2 = _best(lambda: rowimage.encode(table, threads=2), repeat)
    assert image2.data == image.data
    t_rows, _ = _best(lambda: (unsaferow.encode(table.column("key")), unsaferow.encode(table.column("value"))),
                      repeat)
    raw = rowimage.RowImage(rowimage.encode(table, codec=rowimage.RAW).data, name)
    raw_bytes = int(raw.index["raw"].sum())
    blocks = [raw.block(b) for b in range(raw.blocks)]
    compressor = zstandard.ZstdCompressor(level=1, write_checksum=False)
    t_zstd, _ = _best(lambda: [compressor.compress(b) for b in blocks], repeat)
    t_snap, snap = _best(lambda: datafile.encode(table), repeat)
    return {
        "rows": n, "image_s": t_image, "image_rows_per_s": n / t_image,
        "image_threads2_s": t_image2, "image_threads2_rows_per_s": n / t_image2,
        "unsaferow_s": t_rows, "zstd_s": t_zstd,
        "image_bytes": image.size, "image_bytes_per_row": image.size / n, "blocks": image.blocks,
        "raw_bytes_per_row": raw_bytes / n,
        "snapshot_bytes": snap.size, "snapshot_bytes_per_row": snap.size / n, "snapshot_s": t_snap,
        "image_over_snapshot_bytes": image.size / snap.size,
    }


def report(results: dict, rows: int) -> str:
    lines = [f"# Row images: encode throughput and bytes, {rows:,} rows", "",
             "`rowimage.encode` of a typed table (zstd 1, 4 KiB blocks), best of the repeats, beside "
             "`datafile.encode` (the typed snapshot, zstd 3) of the same rows. 2-core machine, shared.", "",
             "| data set | image encode (rows/s) | with 2 zstd threads (rows/s) | UnsafeRow encode of keys+values (s) "
             "| zstd pass alone (s) | image B/row | raw records B/row | typed snapshot B/row | image / snapshot "
             "| snapshot encode (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in results.items():
        lines.append(f"| {name} | {m['image_rows_per_s']:,.0f} ({m['image_s']:.2f} s) | "
                     f"{m['image_threads2_rows_per_s']:,.0f} ({m['image_threads2_s']:.2f} s) | {m['unsaferow_s']:.2f} | "
                     f"{m['zstd_s']:.2f} | {m['image_bytes_per_row']:.1f} | {m['raw_bytes_per_row']:.1f} | "
                     f"{m['snapshot_bytes_per_row']:.1f} | {m['image_over_snapshot_bytes']:.2f}x | {m['snapshot_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    args = parser.parse_args(argv)
    results = {}
    for name, make in (("bench", bench_rows), ("sessions", sessions_rows)):
        results[name] = measure(name, make(args.rows), args.repeat)
        print(name, json.dumps(results[name]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(results, args.rows)
    (args.out / "row_images.md").write_text(text)
    (args.out / "row_images.json").write_text(json.dumps({"rows": args.rows, "cpus": os.cpu_count(),
                                                          "results": results}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
