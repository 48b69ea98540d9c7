"""The worker's memory while it compacts (issue 35: "the worker streams, never holding a partition's state
whole"): peak resident memory and time of one compaction of a large chain, in a process of its own.

    .venv/bin/python -m benchmarks.compaction_memory setup DIR [--rows 2500000]
    /usr/bin/time -v .venv/bin/python -m benchmarks.compaction_memory compact DIR
    /usr/bin/time -v .venv/bin/python -m benchmarks.compaction_memory open DIR      # the floor: imports, store

``setup`` writes a store as an aggregation leaves it (key ``struct<k: long>``, value ``struct<sum: long,
count: long>``, random int32 hashes, max parallelism 100,800) with the project's own writers: version 1
commits ``--rows`` keys (a sorted snapshot), version 2 a delta of ``--rows`` keys, half of them updates
of version 1's keys and half new ones. ``compact`` opens the store as a fresh worker would and runs the
compaction a commit of version 2 queues (its deltas hold half the snapshot's rows): the merged snapshot
and its row image, written beside the chain. It prints the seconds it took; ``/usr/bin/time -v`` gives
the process's peak resident set ("Maximum resident set size"). ``open`` stops before compacting, once it
has opened each file (its index and head): the process's floor (Python, numpy, pyarrow and what they import
on first use, the store), to subtract. Run ``compact`` from a checkout of another commit (its
``spark_state`` first on ``PYTHONPATH``) for the figures before a change.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

MAX_PARALLELISM = 100_800
KEY = pa.struct([pa.field("k", pa.int64(), False)])
VALUE = pa.struct([pa.field("sum", pa.int64(), False), pa.field("count", pa.int64(), False)])
SETTINGS = dict(max_parallelism=MAX_PARALLELISM, snapshot_interval=10, file_grace_period=0, row_images_min_rows=0)


def _changes(keys: np.ndarray, gen: int) -> pa.Table:
    """An aggregation's changes for these keys: hash = a random int32 per key (seeded by the key)."""
    h = ((keys * 0x9E3779B1 + 12345) % (2 ** 32) - 2 ** 31).astype(np.int32)
    kg = np.mod(h.astype(np.int64), MAX_PARALLELISM).astype(np.int32)
    key = pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY))
    value = pa.StructArray.from_arrays([pa.array(keys % 1000 * gen), pa.array(np.full(len(keys), gen, np.int64))],
                                       fields=list(VALUE))
    return pa.table({"kg": kg, "hash": h, "key": key, "value": value})


def _store(root: Path):
    from spark_state.chain.store import VersionedStore
    from spark_state.options import Settings
    from spark_state.storage.filesystem import FileSystemCheckpointStorage

    return VersionedStore(FileSystemCheckpointStorage(f"file://{root}", fsync=False), Settings(**SETTINGS))


def setup(root: Path, rows: int) -> None:
    if root.exists():
        shutil.rmtree(root)
    store = _store(root)
    store.commit(1, _changes(np.arange(rows, dtype=np.int64), 1))
    store.commit(2, _changes(np.arange(rows // 2, rows // 2 + rows, dtype=np.int64), 2),
                 keys=rows + rows // 2)
    print(json.dumps({"rows": rows, "files": {f: (root / f).stat().st_size for f in store.storage.list_files()}}))


def compact(root: Path, run: bool) -> None:
    store = _store(root)
    manifest = store.reader.read_manifest(2)
    assert store.compactor.due(manifest), "version 2's chain is not due for compaction"
    if not run:   # what any compaction imports on the way (pyarrow's to_numpy brings pandas): part of the floor
        for entry in manifest.files:
            store.reader.open_entry(entry)
        return
    started = time.perf_counter()
    store.compactor.compact(2)
    took = time.perf_counter() - started
    record = store.reader.view(2).record
    assert record is not None and record.snapshot.image is not None
    print(json.dumps({"seconds": round(took, 2), "rows": record.snapshot.rows, "snapshot_bytes": record.snapshot.size,
                      "image_bytes": record.snapshot.image.size}))
    # the next run compacts again: drop the record and what it names
    store.storage.delete_files([record.snapshot.path, record.snapshot.image.path])
    (root / "chk-2" / "_snapshot").unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["setup", "compact", "open"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--rows", type=int, default=2_500_000)
    args = parser.parse_args(argv)
    if args.what == "setup":
        setup(args.dir, args.rows)
    else:
        compact(args.dir, args.what == "compact")


if __name__ == "__main__":
    sys.exit(main())
