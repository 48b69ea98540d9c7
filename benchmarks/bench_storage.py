"""Write and restore N rows through both checkpoint storages; prints rows/s and bytes on disk.

    python -m benchmarks.bench_storage [--rows 1000000] [--level 3]

Data: 16-byte uniformly random keys (incompressible, like hashed ids) and
64-byte values shaped like a Spark UnsafeRow of (count: long, last_seen:
timestamp, name: string): an 8-byte null bitset (zero), a small count, a
millisecond timestamp near "now", the string's offset-and-size word and 32
bytes of a name drawn from a 1000-word vocabulary. Hashes are uniformly
random int32 (what Murmur3 gives), key groups pmod(hash, 100800).

Measured per storage: commit of all rows as version 1 (one snapshot file),
commit of version 2 updating 10% of the keys (one delta), full restore of
version 1 (one file), restore of version 2 (snapshot + delta merged), a
restore of 1/8 of the key groups (what a rescale 1 -> 8 partitions reads), and
the median latency of a small commit (100 changed keys: a typical batch of a
partition, where fixed per-commit costs such as fsync show). The filesystem
storage runs twice, with ``fsync`` on (the default) and off, to price it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa

from spark_state.chain import forget_stores, open_store
from spark_state.format.tables import CHANGES_SCHEMA
from spark_state.keygroups import key_groups_of, owned_key_groups
from spark_state.options import DEFAULT_MAX_PARALLELISM, Settings
from spark_state.storage.layout import StoreRef
from spark_state.storage.memory import clear_registry


def _binary(matrix: np.ndarray) -> pa.Array:
    n, width = matrix.shape
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * width).tobytes())
    return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(np.ascontiguousarray(matrix).tobytes())])


def make_rows(n: int, seed: int = 0, keys: np.ndarray | None = None, hashes: np.ndarray | None = None) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if keys is None:
        keys = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        hashes = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    words = rng.integers(0, 256, (1000, 32), dtype=np.uint8) % 26 + ord("a")
    values = np.zeros((n, 64), dtype=np.uint8)
    values[:, 8:16] = rng.integers(1, 500, n, dtype=np.int64).view(np.uint8).reshape(n, 8)
    values[:, 16:24] = (1_760_000_000_000 + rng.integers(0, 3_600_000, n)).astype(np.int64).view(np.uint8).reshape(n, 8)
    values[:, 24:32] = np.frombuffer(np.array([(32 << 32) | 32], dtype=np.int64).tobytes(), np.uint8)
    values[:, 32:64] = words[rng.integers(0, 1000, n)]
    return pa.table({"kg": pa.array(key_groups_of(hashes, DEFAULT_MAX_PARALLELISM)), "hash": pa.array(hashes),
                     "key": _binary(keys), "value": _binary(values)}, schema=CHANGES_SCHEMA), keys, hashes


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run(rows: int, level: int) -> list[dict]:
    base, keys, hashes = make_rows(rows)
    upd_idx = np.random.default_rng(1).choice(rows, rows // 10, replace=False)
    update, _, _ = make_rows(len(upd_idx), seed=2, keys=keys[upd_idx], hashes=hashes[upd_idx])
    raw = rows * (16 + 64)
    results = []
    tmp = tempfile.mkdtemp(prefix="bench_storage_")
    try:
        for label, kind, fsync in (("filesystem", "filesystem", True), ("filesystem, no fsync", "filesystem", False),
                                   ("memory", "memory", False)):
            forget_stores()
            where = f"{tmp}/{label.replace(' ', '').replace(',', '-')}"
            ref = StoreRef(f"file:{where}", f"file:{where}/0/0", 0, 0)
            settings = Settings(storage=kind, compression_level=level, memory_max_state_size=1 << 34, fsync=fsync)
            store = open_store(ref, settings)
            r = {"storage": label}
            t = time.perf_counter()
            res = store.commit(1, base)
            r["commit"] = rows / (time.perf_counter() - t)
            r["bytes"] = res.bytes_written
            t = time.perf_counter()
            store.commit(2, update)
            r["commit_delta"] = len(upd_idx) / (time.perf_counter() - t)
            t = time.perf_counter()
            n1 = store.load(1).num_rows
            r["restore"] = n1 / (time.perf_counter() - t)
            t = time.perf_counter()
            n2 = store.load(2).num_rows
            r["restore_chain"] = n2 / (time.perf_counter() - t)
            t = time.perf_counter()
            part = store.load(1, key_groups=owned_key_groups(3, 8, DEFAULT_MAX_PARALLELISM)).num_rows
            r["restore_eighth"] = part / (time.perf_counter() - t)
            assert n1 == n2 == rows, (n1, n2)
            r["raw"] = raw
            r["disk"] = (_du(where) if kind == "filesystem"
                         else sum(len(b) for b in store.storage._files.values()))
            small = []
            for v in range(3, 23):
                batch = update.slice((v * 100) % max(1, len(upd_idx) - 100), 100)
                t = time.perf_counter()
                store.commit(v, batch)
                small.append(time.perf_counter() - t)
            r["commit_small_ms"] = statistics.median(small) * 1000
            results.append(r)
            if kind == "memory":
                clear_registry(store.storage.root)
    finally:
        forget_stores()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--level", type=int, default=3, help="zstd level (default 3, the plugin's default)")
    args = parser.parse_args(argv)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is a dependency, but the numbers matter more than the frame
        Console = None
    if Console:
        with Console().status(f"writing and restoring {args.rows:,} rows through both storages..."):
            results = run(args.rows, args.level)
    else:
        results = run(args.rows, args.level)
    cols = [("storage", "storage", str),
            ("commit", "commit rows/s", lambda v: f"{v:,.0f}"),
            ("commit_delta", "delta 10% rows/s", lambda v: f"{v:,.0f}"),
            ("restore", "restore rows/s", lambda v: f"{v:,.0f}"),
            ("restore_chain", "restore v2 rows/s", lambda v: f"{v:,.0f}"),
            ("restore_eighth", "1/8 kgs rows/s", lambda v: f"{v:,.0f}"),
            ("commit_small_ms", "100-key commit ms", lambda v: f"{v:.2f}"),
            ("raw", "raw MiB", lambda v: f"{v / 2**20:.1f}"),
            ("disk", "stored MiB", lambda v: f"{v / 2**20:.1f}")]
    if Console:
        table = Table(title=f"spark_state storage, {args.rows:,} rows, 16 B keys + 64 B values, zstd {args.level}")
        for _, title, _ in cols:
            table.add_column(title, justify="right")
        for r in results:
            table.add_row(*[fmt(r[k]) for k, _, fmt in cols])
        Console(width=150).print(table)
        print("raw = key+value bytes of v1; stored = all files of v1 (snapshot) + v2 (delta) + manifests")
    else:
        for r in results:
            print("  ".join(f"{title}={fmt(r[k])}" for k, title, fmt in cols))


if __name__ == "__main__":
    main()
