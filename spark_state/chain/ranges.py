"""Folding a chain one key-group range at a time, so compaction and image writing hold a range's rows and
never a partition's state whole (issue 35: the worker's memory is bounded by a chunk, not by the state).

A key's rows all share its key group (``pmod(hash, maxParallelism)``), so the state of a range of key
groups is the fold of every file's rows in that range alone (``merge.merge_chain``). The key groups are cut
into ranges of about ``RANGE_ROWS`` rows of input each (hashes spread evenly over them) and each range is
folded in turn, in ascending order, which is the order a snapshot and its row image are written in:

* a file whose batches hold ascending key-group ranges (a compacted snapshot, an opaque delta, a file of one
  batch) gives each range by its index, reading only the batches that hold it;
* a file in arrival order (a typed delta, a first snapshot written while its batch ran), whose every batch
  spans nearly every key group, is read once, batch by batch, and its rows are split into one local scratch
  file per range (lz4 Arrow IPC in a private temporary directory, deleted when the fold ends: scratch, never
  state), from which each range is read back.

Holding at once: one range's rows from each file and their fold, a few batches while splitting, and per file
its index. ``FixedDictionaries`` gathers, on the way, what the snapshot's dictionary columns must hold
before its first row is written.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import Iterator

import numpy as np
import pyarrow as pa

from spark_state.chain.merge import merge_chain
from spark_state.chain.reader import ChainReader, EntryReader
from spark_state.format import dictionaries, tables
from spark_state.format.manifest import FileEntry

#: Rows of input (the chain's files' row counts) folded at once: 256k rows of an aggregation's state are about
#: 10 MiB as Arrow; a range's fold, its snapshot batches and its image blocks a few times that.
RANGE_ROWS = 1 << 18
_SCRATCH = pa.ipc.IpcWriteOptions(compression="lz4")


def key_group_ranges(chain: tuple[FileEntry, ...], max_parallelism: int,
                     range_rows: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering every key group, about `range_rows` rows of the chain's files in each."""
    rows = sum(entry.rows for entry in chain)
    count = min(max_parallelism, max(1, math.ceil(rows / (range_rows or RANGE_ROWS))))
    bounds = np.linspace(0, max_parallelism, count + 1).round().astype(np.int64)
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


class RangeFold:
    """A chain's state a key-group range at a time (see the module docstring). Use as a context manager (the
    scratch files go when it ends); iterate for each range's rows in key-group order (ranges without rows are
    skipped). ``dictionaries`` is what each typed dictionary column of the snapshot may hold."""

    def __init__(self, reader: ChainReader, chain: tuple[FileEntry, ...], ranges: list[tuple[int, int]],
                 scratch_dir: str | None = None):
        self.reader, self.chain, self.ranges = reader, chain, ranges
        self._scratch_parent = scratch_dir
        self._scratch: str | None = None
        self._files: list[EntryReader] = []
        self._spilled: set[tuple[int, int]] = set()   # (entry, range) with a scratch file
        self._dictionaries: dictionaries.FixedDictionaries | None = None

    def __enter__(self) -> "RangeFold":
        try:
            self._files = [self.reader.open_entry(entry) for entry in self.chain]
            typed = [f for f in self._files if f.entry.typed]
            if typed:
                rows = sum(entry.rows for entry in self.chain)
                self._dictionaries = dictionaries.FixedDictionaries(
                    typed[0].file.schema, int(rows * dictionaries.MAX_DISTINCT_SHARE))
            for i, f in enumerate(self._files):
                if f.batches_in_key_group_order:
                    if self._dictionaries is not None:
                        self._dictionaries.take_file(f.file.dictionaries())
                else:
                    self._split(i, f)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    @property
    def dictionaries(self) -> dict:
        """The dictionary of each column a typed snapshot of this fold stores as one (``FixedDictionaries``)."""
        return {} if self._dictionaries is None else self._dictionaries.fixed()

    def empty_state(self) -> pa.Table:
        """No rows, in the chain's typed schema (the state of a chain whose deletes removed every key)."""
        schema = self._files[0].file.schema
        return tables.typed_schema(dictionaries.plain_type(schema.field("key").type),
                                   dictionaries.plain_type(schema.field("value").type)).empty_table()

    def _path(self, i: int, r: int) -> str:
        return os.path.join(self._scratch, f"{i}-{r}.arrow")

    def _split(self, i: int, f: EntryReader) -> None:
        """Entry `i`'s rows (in arrival order) into a scratch file per range, read once batch by batch."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="spark-state-fold-", dir=self._scratch_parent)
        starts = np.array([lo for lo, _ in self.ranges[1:]], dtype=np.int64)
        writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        try:
            for table in f.batches():
                if not table.num_rows:
                    continue
                if self._dictionaries is not None:
                    self._dictionaries.collect(table)
                which = np.searchsorted(starts, table.column("kg").to_numpy(), side="right")
                order = np.argsort(which, kind="stable")
                counts = np.bincount(which, minlength=len(self.ranges))
                table = table.take(pa.array(order)).combine_chunks()
                at = 0
                for r in np.flatnonzero(counts).tolist():
                    n = int(counts[r])
                    if r not in writers:
                        writers[r] = pa.ipc.new_stream(self._path(i, r), table.schema, options=_SCRATCH)
                        self._spilled.add((i, r))
                    writers[r].write_table(table.slice(at, n))
                    at += n
        finally:
            for writer in writers.values():
                writer.close()

    def _part(self, i: int, r: int) -> pa.Table | None:
        """Entry `i`'s rows of range `r` (None: it has none there)."""
        f = self._files[i]
        if f.batches_in_key_group_order:
            lo, hi = self.ranges[r]
            table = f.read(np.arange(lo, hi, dtype=np.int32))
        elif (i, r) in self._spilled:
            with pa.memory_map(self._path(i, r)) as source:
                table = pa.ipc.open_stream(source).read_all()
            os.unlink(self._path(i, r))   # read once: its disk goes now
        else:
            return None
        return table if table.num_rows else None

    def __iter__(self) -> Iterator[pa.Table]:
        for r in range(len(self.ranges)):
            parts = [p for p in (self._part(i, r) for i in range(len(self._files))) if p is not None]
            if not parts:
                continue
            state = merge_chain(parts, ordered=True)
            if state.num_rows:
                yield state
