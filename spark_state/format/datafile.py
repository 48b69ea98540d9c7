"""The data file format: one version's rows of one store (a snapshot or a delta), by key group.

(Over 400 lines on purpose: the spec, the writer and the reader of one byte layout stay in one module,
so a change to the bytes is made, and reviewed, in one place.)

A file is three parts, all little-endian, nothing pickled::

    data     an Arrow IPC *stream* (zstd-compressed buffers) of the rows:
             the schema, the dictionaries of a typed file's dictionary
             columns (if any, one per column), then the rows sorted by key
             group, cut into record batches that hold whole key-group runs (a
             key group bigger than the batch target gets batches of its own),
             then the end-of-stream marker. Typed *deltas* keep the rows in
             the order the shim sent them (no gather by key group on the
             commit path: ~30% of a delta's encode) in batches of ~the
             target size, as does a first snapshot written while its batch
             ran (``StreamEncoder``; a load sorts it, compaction rewrites it).
    index    an Arrow IPC stream of BATCH_INDEX_SCHEMA (typed files): one
             row per batch, its byte range, CRC-32, rows and the smallest and
             largest key group it holds; or of INDEX_SCHEMA (opaque files, and typed
             files written before the batch index): one row per (key group,
             batch): the batch's byte range and CRC-32, and the key group's
             row range inside that batch
    trailer  u64 index offset, u64 index length, 8-byte magic

Two row layouts (``FileFormat``), told apart by the file's magic and its manifest entry:

* **format 2, typed** (what stores are written in): ``hash: int32``, ``key``
  and ``value`` as struct columns with the operator's key and value schemas,
  as Spark's own Arrow conversion (``ArrowWriter`` in the JVM shim) maps every
  Spark type. Any Arrow reader (pandas, DuckDB, Polars) can read the rows, and
  typed columns compress far better than opaque row bytes. The key group is
  not stored: it is ``pmod(hash, maxParallelism)``, recomputed on read (the
  index keeps it). A null ``value`` is a delete (only in deltas). A string or
  binary leaf whose values repeat (at most half as many distinct values as
  rows) is stored as an Arrow dictionary column (``spark_state.format.dictionaries``:
  3-8x fewer bytes for such columns); readers get Spark's plain types back.
  Files without dictionaries (written before them) read the same way.
* **format 1, opaque** (CHANGES_SCHEMA): ``kg``, ``hash`` and ``key``/``value``
  as the bytes of Spark's ``UnsafeRow``s. Still read (checkpoints written
  before typed files); still written for a store whose schema Spark's Arrow
  conversion cannot map.

Tables in memory (``spark_state.format.tables``) always carry ``kg`` first
(typed files get it on read).

The data part alone is a standard Arrow stream (``pyarrow.ipc.open_stream``
reads a whole file and stops at the marker), so a full restore is one read
and one decode. A key-group subset reads the index, then only the batches
that hold a wanted group, by byte range, and never decodes the others
(Flink's ``KeyGroupsStateHandle``: one file, an offset per key group).
Batches pack small neighbouring key groups together (``TARGET_BATCH_BYTES``
of raw data) because a batch per key group would cost ~300 bytes of Arrow
metadata and a cold zstd context per group; the price is that a subset read
also decodes the small neighbours that share a wanted group's batch.

Compression is Arrow IPC's own per-buffer zstd: measured against zstd over
whole serialized batches it is as small (0.55 vs 0.53-0.60 of raw on 16-byte
random keys + 64-byte structured values) and keeps batches independently
decodable. Checksums are CRC-32 (``zlib.crc32``, ~3 GB/s here vs ~0.7 GB/s
for blake2b): they guard against torn or bit-rotted files, not adversaries,
and the file size is checked too, so truncation is caught before any CRC.
The manifest holds the whole file's CRC and the index's CRC; the index holds
each batch's CRC, so a subset read verifies everything it reads.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.format import dictionaries
from spark_state.format.tables import (
    CHANGES_SCHEMA, WIDEN_AT, conform, is_typed, payload_bytes, retyped, widen, widen_typed,
)
from spark_state.keygroups import key_group_order, key_groups_of

INDEX_SCHEMA = pa.schema([
    ("kg", pa.int32()),
    ("offset", pa.int64()),      # byte offset of the batch's IPC message in the file
    ("length", pa.int64()),      # byte length of that message
    ("crc", pa.uint32()),        # CRC-32 of those bytes
    ("row_start", pa.int64()),   # first row of the key group inside the batch
    ("rows", pa.int64()),        # rows of the key group inside the batch
])

#: The index of typed files: a row per record batch. Batches hold whole key-group runs in key-group order, so a
#: batch's key groups are the range [first_kg, last_kg]; a subset read takes the batches whose range holds a
#: wanted group and keeps their rows whose derived key group is wanted. A delta in arrival order records each
#: batch's smallest and largest key group: the same read is exact for it too (it takes more batches, but a
#: partition's key groups are strided, kg mod N, so it takes nearly all of a delta's batches in any order).
#: Per-(key group, batch) rows (INDEX_SCHEMA) cost ~2.5 bytes per row of a delta, where nearly every row has a
#: key group of its own (100k changed rows, 100,800 key groups): 11% of the file; a row per batch costs nothing.
BATCH_INDEX_SCHEMA = pa.schema([
    ("first_kg", pa.int32()),
    ("last_kg", pa.int32()),
    ("offset", pa.int64()),
    ("length", pa.int64()),
    ("crc", pa.uint32()),
    ("rows", pa.int64()),
])



class FileFormat(IntEnum):
    """A data file's row layout (the last byte of its magic; ``file_format`` in its manifest entry)."""

    OPAQUE = 1   # Spark's UnsafeRow bytes (CHANGES_SCHEMA)
    TYPED = 2    # struct columns (see the module docstring)


#: The newest data file format this code reads.
NEWEST_FILE_FORMAT = FileFormat.TYPED
MAGIC = b"SPKST\x00\x00\x02"  # last byte = file format
_MAGICS = {fmt: MAGIC[:-1] + bytes([fmt]) for fmt in FileFormat}
_TRAILER = struct.Struct("<QQ8s")
TRAILER_SIZE = _TRAILER.size

#: Raw bytes of rows per record batch (see module docstring). 1 MiB: typed columns compress ~5% smaller than
#: in 256 KiB batches (each buffer is its own zstd frame), and a subset read decodes at most that much extra.
TARGET_BATCH_BYTES = 1024 * 1024
#: Per-row bytes beyond key and value (kg, hash, two int32 offsets).
_ROW_OVERHEAD = 16

Fetch = Callable[[Sequence[tuple[int, int]]], Sequence[bytes]]
"""Reads byte ranges [start, end) of one file, returning one bytes-like per range."""


def crc32_hex(data) -> str:
    return f"crc32:{zlib.crc32(data):08x}"


@dataclass(frozen=True)
class EncodedFile:
    """A serialised state file and what its manifest entry records about it."""

    data: bytes
    rows: int
    checksum: str
    index_offset: int
    index_length: int
    index_checksum: str
    file_format: int = FileFormat.OPAQUE

    @property
    def size(self) -> int:
        return len(self.data)


# ------------------------------------------------------------------ writing

def _batch_ids(kg: np.ndarray, row_bytes: np.ndarray, target: int) -> np.ndarray:
    """Assigns sorted rows to batches: whole key-group runs packed up to ~target bytes;
    a run bigger than target is alone and split by rows. Vectorised; rows are never looped over."""
    n = len(kg)
    run_first = np.ones(n, dtype=bool)
    run_first[1:] = kg[1:] != kg[:-1]
    run_start = np.flatnonzero(run_first)
    run_of_row = np.cumsum(run_first) - 1
    before = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(row_bytes, out=before[1:])
    run_bytes = np.add.reduceat(row_bytes, run_start)
    run_begin = before[run_start]
    big = run_bytes > target
    bucket = run_begin // target
    new_group = np.ones(len(run_start), dtype=bool)
    new_group[1:] = (bucket[1:] != bucket[:-1]) | big[1:] | big[:-1]
    group_of_run = np.cumsum(new_group) - 1
    group = group_of_run[run_of_row]
    sub = np.where(big[run_of_row], (before[:-1] - run_begin[run_of_row]) // target, 0)
    first = np.ones(n, dtype=bool)
    first[1:] = (group[1:] != group[:-1]) | (sub[1:] != sub[:-1])
    return np.cumsum(first) - 1


def encode(table: pa.Table, compression_level: int = 3, *, sorted_by_kg: bool = False,
           target_batch_bytes: int | None = None, arrival_order: bool = False) -> EncodedFile:
    """Serialises rows (typed, or opaque CHANGES_SCHEMA) into one state file; sorts by key group unless told
    they are. Typed rows are stored without ``kg`` (see the module docstring).

    ``arrival_order`` (typed deltas): rows stay in the order given, cut into batches of ~target bytes,
    each indexed by its smallest and largest key group (see the module docstring)."""
    table = conform(table)
    typed = is_typed(table)
    target_batch_bytes = target_batch_bytes or TARGET_BATCH_BYTES
    if arrival_order and typed and payload_bytes(table) < WIDEN_AT:
        return _encode_in_arrival_order(table, compression_level, target_batch_bytes)
    wide = payload_bytes(table) >= WIDEN_AT   # sorting concatenates; 32-bit offsets would overflow past 2 GiB
    if wide and not typed:
        table = widen(table)
    if wide and typed:   # 64-bit offsets while sorting; each batch is written with the table's own types
        narrow_schema = table.schema.remove(table.schema.get_field_index("kg"))
        table = widen_typed(table)
    table = table.combine_chunks()
    if not sorted_by_kg and table.num_rows > 1:
        kg = table.column("kg").to_numpy()
        if np.any(kg[1:] < kg[:-1]):
            table = table.take(key_group_order(kg))
    n = table.num_rows
    kg = table.column("kg").to_numpy()
    if n:
        if typed:   # struct columns have no per-row length: spread their bytes evenly
            row_bytes = np.full(n, payload_bytes(table) // n + _ROW_OVERHEAD, dtype=np.int64)
        else:
            key_len = pc.binary_length(table.column("key")).to_numpy().astype(np.int64)
            val_len = pc.fill_null(pc.binary_length(table.column("value")), 0).to_numpy().astype(np.int64)
            row_bytes = key_len + val_len + _ROW_OVERHEAD
        batch = _batch_ids(kg, row_bytes, target_batch_bytes)
        batch_first = np.flatnonzero(np.diff(batch, prepend=-1) != 0)
    else:
        batch = np.zeros(0, dtype=np.int64)
        batch_first = np.zeros(0, dtype=np.int64)
    batch_rows = np.diff(np.append(batch_first, n))

    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level))
    sink = pa.BufferOutputStream()
    if typed and wide:   # no dictionaries for a partition this big: each batch narrows back on its own
        stored, schema = table.drop_columns(["kg"]), narrow_schema
    elif typed:
        stored = dictionaries.encode(table.drop_columns(["kg"]))
        schema = stored.schema
    else:
        stored, schema = table, CHANGES_SCHEMA
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for start, rows in zip(batch_first.tolist(), batch_rows.tolist()):
            part = stored.slice(start, rows)
            if part.schema != schema:
                part = retyped(part, schema) if typed else part.cast(schema)
            writer.write_table(part)
    data = sink.getvalue()
    offsets, lengths, crcs = _batch_ranges(data)

    if typed:   # one index row per batch
        last = np.append(batch_first[1:], n)[:len(batch_first)] - 1
        index = _batch_index(kg[batch_first], kg[last], offsets, lengths, crcs, batch_rows)
    elif n:   # one index row per (key group, batch) run
        entry_first = np.ones(n, dtype=bool)
        entry_first[1:] = (kg[1:] != kg[:-1]) | (batch[1:] != batch[:-1])
        entry_start = np.flatnonzero(entry_first)
        entry_batch = batch[entry_start]
        index = pa.table({
            "kg": pa.array(kg[entry_start], pa.int32()),
            "offset": pa.array(offsets[entry_batch]),
            "length": pa.array(lengths[entry_batch]),
            "crc": pa.array(crcs[entry_batch], pa.uint32()),
            "row_start": pa.array(entry_start - batch_first[entry_batch]),
            "rows": pa.array(np.diff(np.append(entry_start, n))),
        }, schema=INDEX_SCHEMA)
    else:
        index = INDEX_SCHEMA.empty_table()
    return _assemble(data, index, n, FileFormat.TYPED if typed else FileFormat.OPAQUE, options)


def _encode_in_arrival_order(table: pa.Table, compression_level: int, target_batch_bytes: int) -> EncodedFile:
    """encode for typed rows kept in the order given: no gather of the rows by key group, batches are plain
    slices. A delta's rows spread over nearly every key group, and a partition's key groups are strided
    (``kg mod N``), so a subset read takes nearly every batch of a delta whatever its order."""
    table = table.combine_chunks()
    n = table.num_rows
    kg = table.column("kg").to_numpy()
    per_batch = max(1, target_batch_bytes // (payload_bytes(table) // max(n, 1) + _ROW_OVERHEAD))
    batch_first = np.arange(0, n, per_batch, dtype=np.int64)
    batch_rows = np.diff(np.append(batch_first, n))
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level))
    stored = dictionaries.encode(table.drop_columns(["kg"]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, stored.schema, options=options) as writer:
        for start, rows in zip(batch_first.tolist(), batch_rows.tolist()):
            writer.write_table(stored.slice(start, rows))
    data = sink.getvalue()
    offsets, lengths, crcs = _batch_ranges(data)
    if n:
        first_kg, last_kg = np.minimum.reduceat(kg, batch_first), np.maximum.reduceat(kg, batch_first)
    else:
        first_kg = last_kg = np.zeros(0, dtype=np.int32)
    index = _batch_index(first_kg, last_kg, offsets, lengths, crcs, batch_rows)
    return _assemble(data, index, n, FileFormat.TYPED, options)


@dataclass(frozen=True)
class StreamedFile:
    """What a manifest entry records about a file a ``StreamEncoder`` wrote (its bytes went to storage)."""

    rows: int
    size: int
    checksum: str
    index_offset: int
    index_length: int
    index_checksum: str
    file_format: int = FileFormat.TYPED


class _Pieces:
    """The file-like sink Arrow's IPC writer writes one message at a time into; drained after each message."""

    closed = False

    def __init__(self):
        self.parts: list = []

    def write(self, data) -> int:
        self.parts.append(data)
        return len(data)

    def flush(self) -> None:
        pass

    def drain(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


class StreamEncoder:
    """A typed data file written while its rows arrive: each ``write`` encodes its rows into record batches of
    ~the target size and hands their bytes to ``out`` at once, so what is left at ``finish`` is the end of the
    stream, the batch index and the trailer. Two writers use it:

    * a commit's changes streamed during the batch (docs/protocol.md "Streamed commits"): rows in arrival
      order, no dictionary columns (a file's dictionaries precede its first batch); the bytes are exactly what
      ``encode(..., arrival_order=True)`` lays out;
    * compaction a key-group range at a time (``spark_state.chain.ranges``): rows in key-group order across
      the writes, so the file is a sorted snapshot, with the dictionary columns ``fixed`` before the first
      row (``dictionaries.FixedDictionaries``).

    Every reader reads the file as any other."""

    def __init__(self, out: Callable[[bytes], None], compression_level: int,
                 target_batch_bytes: int | None = None, *, fixed: dict | None = None):
        self._fixed = fixed or {}
        self._out = out
        self._options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level))
        self._target = target_batch_bytes or TARGET_BATCH_BYTES
        self._pieces = _Pieces()
        self._writer = None
        self._schema: pa.Schema | None = None
        self._size = 0
        self._crc = 0
        self._index: list[tuple[int, int, int, int, int, int]] = []   # first_kg, last_kg, offset, length, crc, rows
        self.rows = 0
        self.deletes = 0

    @property
    def schema(self) -> pa.Schema | None:
        """The stored schema (hash, key, value), fixed by the first rows written."""
        return self._schema

    def _emit(self, data: bytes) -> None:
        if data:
            self._out(data)
            self._crc = zlib.crc32(data, self._crc)
            self._size += len(data)

    def write(self, table: pa.Table) -> None:
        """Appends typed rows (``kg`` first, as tables in memory have it) in the order given."""
        n = table.num_rows
        if not n:
            return
        stored = table.drop_columns(["kg"]).combine_chunks()
        if self._fixed:
            stored = dictionaries.encode_fixed(stored, self._fixed)
        if self._writer is None:
            self._schema = stored.schema
            self._writer = pa.ipc.new_stream(self._pieces, stored.schema, options=self._options)
        elif stored.schema != self._schema:
            raise ValueError(f"rows with schema {stored.schema} after rows with schema {self._schema}")
        kg = table.column("kg").to_numpy()
        per_batch = max(1, self._target // (payload_bytes(table) // n + _ROW_OVERHEAD))
        [batch] = stored.to_batches() or [None]
        for start in range(0, n, per_batch):
            part = batch.slice(start, per_batch)
            head = self._size == 0
            self._writer.write_batch(part)
            data = self._pieces.drain()
            if head:   # everything before the first batch is the file's head: its schema and dictionaries
                head_len = _head_length(data)
                self._emit(data[:head_len])
                data = data[head_len:]
            offset = self._size
            self._emit(data)
            rows = part.num_rows
            self._index.append((int(kg[start:start + rows].min()), int(kg[start:start + rows].max()), offset,
                                len(data), zlib.crc32(data), rows))
        self.rows += n
        self.deletes += table.column("value").null_count

    def finish(self) -> StreamedFile:
        """Writes the end of the stream, the batch index and the trailer; returns what the manifest records."""
        if self._writer is None:
            raise ValueError("a streamed file needs rows")
        self._writer.close()
        self._emit(self._pieces.drain())   # the end-of-stream marker
        first_kg, last_kg, offsets, lengths, crcs, rows = (np.asarray(c) for c in zip(*self._index))
        index = _batch_index(first_kg, last_kg, offsets.astype(np.int64), lengths.astype(np.int64),
                             crcs.astype(np.uint32), rows)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, index.schema, options=self._options) as writer:
            writer.write_table(index)
        index_bytes = sink.getvalue().to_pybytes()
        index_offset = self._size
        self._emit(index_bytes)
        self._emit(_TRAILER.pack(index_offset, len(index_bytes), _MAGICS[FileFormat.TYPED]))
        return StreamedFile(self.rows, self._size, f"crc32:{self._crc:08x}", index_offset, len(index_bytes),
                            crc32_hex(index_bytes))


def _head_length(data: bytes) -> int:
    """Bytes of ``data`` (a stream's first bytes, up to its first batch) before its first record batch
    message: the schema and any dictionaries (walks the framing; decodes nothing)."""
    src = pa.BufferReader(data)
    reader = pa.ipc.MessageReader.open_stream(src)
    while True:
        start = src.tell()
        if reader.read_next_message().type == "record batch":
            return start


def _batch_ranges(data: pa.Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte offset, length and CRC-32 of each record batch message of an IPC stream: walks the message
    framing (no decoding). The head before the first batch is the schema and the file's dictionaries (one
    per dictionary column, see spark_state.format.dictionaries); a subset read decodes its batches with that head."""
    src = pa.BufferReader(data)
    reader = pa.ipc.MessageReader.open_stream(src)
    starts, ends = [], []
    while True:
        start = src.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        if message.type == "record batch":
            starts.append(start)
            ends.append(src.tell())
        elif starts:
            raise AssertionError(f"Arrow wrote a {message.type} message between record batches")
    offsets = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(ends, dtype=np.int64) - offsets
    view = memoryview(data)
    crcs = np.fromiter((zlib.crc32(view[o:o + ln]) for o, ln in zip(offsets.tolist(), lengths.tolist())),
                       dtype=np.uint32, count=len(offsets))
    return offsets, lengths, crcs


def _batch_index(first_kg, last_kg, offsets, lengths, crcs, rows) -> pa.Table:
    return pa.table({
        "first_kg": pa.array(first_kg, pa.int32()), "last_kg": pa.array(last_kg, pa.int32()),
        "offset": pa.array(offsets), "length": pa.array(lengths), "crc": pa.array(crcs, pa.uint32()),
        "rows": pa.array(rows, pa.int64()),
    }, schema=BATCH_INDEX_SCHEMA)


def _assemble(data: pa.Buffer, index: pa.Table, rows: int, file_format: int, options) -> EncodedFile:
    """data | index | trailer, and what the manifest records about them."""
    index_sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(index_sink, index.schema, options=options) as writer:
        writer.write_table(index)
    index_bytes = index_sink.getvalue()
    index_offset = data.size
    trailer = _TRAILER.pack(index_offset, index_bytes.size, _MAGICS[file_format])
    blob = b"".join((memoryview(data), memoryview(index_bytes), trailer))
    return EncodedFile(blob, rows, crc32_hex(blob), index_offset, index_bytes.size, crc32_hex(index_bytes),
                       file_format)


# ------------------------------------------------------------------ reading

def _corrupt(name: str, why: str) -> ChecksumMismatch:
    return ChecksumMismatch(
        f"state file {name} {why}; it is corrupted or truncated. Restore from another version "
        f"(or another checkpoint) — this file's rows cannot be trusted."
    )


def check_whole(data, name: str, size: int, checksum: str) -> None:
    """Verifies a whole file against its manifest entry (size first: catches truncation cheaply)."""
    if len(data) != size:
        raise _corrupt(name, f"has {len(data)} bytes but its manifest recorded {size}")
    actual = crc32_hex(data)
    if actual != checksum:
        raise _corrupt(name, f"has checksum {actual} but its manifest recorded {checksum}")


def read_trailer(data: bytes, name: str) -> tuple[int, int]:
    """(index offset, index length) from a file's last bytes; for inspection without a manifest."""
    if len(data) < TRAILER_SIZE:
        raise _corrupt(name, "is shorter than its trailer")
    offset, length, magic = _TRAILER.unpack(data[-TRAILER_SIZE:])
    if magic[:-1] != MAGIC[:-1] or magic[-1] < FileFormat.OPAQUE:
        raise _corrupt(name, "does not end with the spark_state file magic")
    if magic[-1] > NEWEST_FILE_FORMAT:
        raise FormatVersionError(
            f"state file {name} has file format version {magic[-1]}, newer than the {int(NEWEST_FILE_FORMAT)} "
            f"this spark_state reads; upgrade spark_state on the executors."
        )
    return offset, length


def decode(data, name: str, max_parallelism: int | None = None, *, verified: bool = False) -> pa.Table:
    """All rows of a whole file (its data part is a plain Arrow IPC stream), with ``kg`` first.

    Typed files do not store ``kg``; it is recomputed from ``hash`` with `max_parallelism`. Bytes not
    ``verified`` against their checksum (``check_whole``) are validated in full after decoding: Arrow's
    IPC reader trusts the offsets inside a batch, and a damaged one would crash the worker later.
    """
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise _corrupt(name, f"cannot be decoded ({err})") from None
    _check_stored_schema(table.schema, name)
    if not verified:
        _validate(table, name, "rows")
    return _with_kg(table, name, max_parallelism)


def _validate(data: pa.Table | pa.RecordBatch, name: str, what: str) -> None:
    """Arrow's full validation (offsets, lengths, UTF-8) of rows whose bytes no checksum vouched for."""
    try:
        data.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError) as err:
        raise _corrupt(name, f"has invalid {what} ({err})") from None


def _check_stored_schema(schema: pa.Schema, name: str) -> None:
    try:
        names = schema.names
    except UnicodeDecodeError:
        raise _corrupt(name, "has a schema whose field names are not UTF-8") from None
    if schema == CHANGES_SCHEMA:
        return
    if (names != ["hash", "key", "value"] or schema.field("hash").type != pa.int32()
            or not pa.types.is_struct(schema.field("key").type) or not pa.types.is_struct(schema.field("value").type)):
        raise _corrupt(name, f"has schema {schema}, expected {CHANGES_SCHEMA} or typed hash, key, value")


def _with_kg(table: pa.Table, name: str, max_parallelism: int | None) -> pa.Table:
    _check_stored_schema(table.schema, name)
    if "kg" in table.column_names:
        return table
    table = dictionaries.decode(table)
    if max_parallelism is None:
        raise ValueError(f"reading typed state file {name} needs the max parallelism to derive key groups")
    return table.add_column(0, "kg", pa.array(key_groups_of(table.column("hash"), max_parallelism), pa.int32()))


def decode_index(data, name: str, checksum: str | None) -> pa.Table:
    if checksum is not None and crc32_hex(data) != checksum:
        raise _corrupt(name, f"has a key-group index with checksum {crc32_hex(data)}, expected {checksum}")
    try:
        index = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise _corrupt(name, f"has an unreadable key-group index ({err})") from None
    if index.schema != INDEX_SCHEMA and index.schema != BATCH_INDEX_SCHEMA:
        raise _corrupt(name, "has a key-group index with an unexpected schema")
    if checksum is None:
        _validate(index, name, "key-group index rows")
    return index


def _read_head(fetch: Fetch, name: str, end: int) -> tuple[pa.Schema, bytes]:
    """The stream's schema and its head, bytes [0, end): the schema message, then any dictionaries."""
    (head,) = fetch([(0, end)])
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(head))
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise _corrupt(name, f"has an unreadable schema ({err})") from None
    _check_stored_schema(schema, name)
    return schema, bytes(head)


#: Arrow IPC's end-of-stream marker (continuation token, zero length).
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_ZEROS = bytes(1 << 20)


def _check_head(head: bytes, name: str, index: pa.Table, index_offset: int, index_length: int,
                index_checksum: str, checksum: str, file_format: int) -> None:
    """Verifies a typed file's head (schema and dictionaries: no CRC of its own) by the whole file's CRC-32
    without reading the batches: a typed file is head | batches | end-of-stream | index | trailer, and the
    index holds each batch's CRC and length, so the file's CRC follows from theirs (``_crc_append``)."""
    offsets, order = np.unique(index.column("offset").to_numpy(), return_index=True)
    lengths = index.column("length").to_numpy()[order]
    crcs = index.column("crc").to_numpy()[order]
    crc, end = zlib.crc32(head), len(head)
    for off, ln, batch_crc in zip(offsets.tolist(), lengths.tolist(), crcs.tolist()):
        if off != end or ln <= 0:
            raise _corrupt(name, f"has batches that do not follow each other (byte {off}, expected {end})")
        crc, end = _crc_append(crc, batch_crc, ln), end + ln
    if end + len(_EOS) != index_offset:
        raise _corrupt(name, f"has batches ending at byte {end}, not where its index starts ({index_offset})")
    crc = _crc_append(zlib.crc32(_EOS, crc), int(index_checksum.removeprefix("crc32:"), 16), index_length)
    crc = zlib.crc32(_TRAILER.pack(index_offset, index_length, _MAGICS[file_format]), crc)
    if f"crc32:{crc:08x}" != checksum:
        raise _corrupt(name, "has a schema or dictionaries (the stream's head) that do not match its checksum")


def _crc_append(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC-32 of A + B from CRC(A), CRC(B) and len(B): CRC-32 is affine in its start value, so
    crc32(B, start=c) == crc32(B) ^ crc32(zeros, c) ^ crc32(zeros) for len(B) zero bytes."""
    shifted, zero = crc_a, 0
    while len_b > 0:
        chunk = memoryview(_ZEROS)[:min(len_b, len(_ZEROS))]
        shifted, zero = zlib.crc32(chunk, shifted), zlib.crc32(chunk, zero)
        len_b -= len(chunk)
    return shifted ^ zero ^ crc_b


def _read_batch(block, schema: pa.Schema, head: bytes | None) -> pa.RecordBatch:
    """One record batch message; with dictionary columns it is decoded as the stream head + the batch."""
    if head is None:
        return pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(block)), schema)
    batches = pa.ipc.open_stream(pa.py_buffer(b"".join((head, block, _EOS)))).read_all().to_batches()
    if len(batches) != 1:
        raise pa.ArrowInvalid(f"a batch's bytes hold {len(batches)} record batches")
    return batches[0]


def read_key_groups(fetch: Fetch, name: str, index_offset: int, index_length: int, index_checksum: str | None,
                    key_groups: np.ndarray, verify: bool = True, *, file_format: int = FileFormat.OPAQUE,
                    max_parallelism: int | None = None, checksum: str | None = None) -> pa.Table:
    """Rows of the given key groups (int32 array), in key-group order, reading only the index and their
    batches (and, for a typed file, the stream's head: its schema and dictionaries).

    With `verify`, the index is checked against `index_checksum` and each batch against its CRC in the
    index; a typed file's head against the whole file's `checksum` (see ``_check_head``). Without a
    `checksum`, or without `verify`, the rows read are validated in full instead (no crash on damaged
    bytes, but a damaged head could still change what they say)."""
    return IndexedFile(fetch, name, index_offset, index_length, index_checksum, verify, file_format=file_format,
                       max_parallelism=max_parallelism, checksum=checksum).read(key_groups)


class IndexedFile:
    """A state file opened by its index (and, typed, its head): any key-group subset (``read``), or all its rows a
    few batches at a time (``batches``), each read verified as ``read_key_groups`` describes. Opening reads and
    checks the index and the head once, so a reader of many subsets (compaction, a key-group range at a time)
    pays for them once."""

    def __init__(self, fetch: Fetch, name: str, index_offset: int, index_length: int, index_checksum: str | None,
                 verify: bool = True, *, file_format: int = FileFormat.OPAQUE, max_parallelism: int | None = None,
                 checksum: str | None = None):
        self._fetch, self.name, self._verify, self._m = fetch, name, verify, max_parallelism
        (index_bytes,) = fetch([(index_offset, index_offset + index_length)])
        self.index = index = decode_index(index_bytes, name, index_checksum if verify else None)
        self.schema, self._head = CHANGES_SCHEMA, None
        self._trusted = verify
        if file_format != FileFormat.OPAQUE:
            all_offsets = index.column("offset").to_numpy()
            # the head ends where the first batch starts; a file of no batches: where its end-of-stream marker does
            head_end = int(all_offsets.min()) if len(all_offsets) else index_offset - len(_EOS)
            self.schema, head = _read_head(fetch, name, head_end)
            if verify and checksum is not None and index_checksum is not None:
                _check_head(head, name, index, index_offset, index_length, index_checksum, checksum, file_format)
            else:
                self._trusted = False
            self._head = head if dictionaries.has_dictionaries(self.schema) else None

    @property
    def batched(self) -> bool:
        """A typed file's index (a row per batch), as opposed to a row per (key group, batch)."""
        return self.index.schema == BATCH_INDEX_SCHEMA

    @property
    def batches_in_key_group_order(self) -> bool:
        """Whether the batches hold ascending key-group ranges that do not overlap (a snapshot written sorted,
        or a file of one batch; not a larger delta or first snapshot written in arrival order), so a range of
        key groups is read from the batches that hold it alone."""
        if not self.batched:
            return True   # a row per (key group, batch): files that index so are always sorted
        first, last = self.index.column("first_kg").to_numpy(), self.index.column("last_kg").to_numpy()
        return bool(np.all(first <= last) and np.all(last[:-1] <= first[1:]))

    def read(self, key_groups: np.ndarray) -> pa.Table:
        """The rows of the given key groups, in key-group order for a sorted file, with ``kg`` first."""
        key_groups = np.unique(np.asarray(key_groups, dtype=np.int32))
        if self.batched:
            return self._read_batch_index(key_groups)
        index, name = self.index, self.name
        kg = index.column("kg").to_numpy()
        pick = np.flatnonzero(np.isin(kg, key_groups))
        if len(pick) == 0:
            return _with_kg(self.schema.empty_table(), name, self._m)
        offsets = index.column("offset").to_numpy()[pick]
        lengths = index.column("length").to_numpy()[pick]
        crcs = index.column("crc").to_numpy()[pick]
        row_start = index.column("row_start").to_numpy()[pick]
        rows = index.column("rows").to_numpy()[pick]

        block_offsets, first_pick, block_of_pick = np.unique(offsets, return_index=True, return_inverse=True)
        batches = self._batches_at(block_offsets, lengths[first_pick], crcs[first_pick])
        table = pa.Table.from_batches(batches, schema=self.schema)
        batch_rows = np.array([b.num_rows for b in batches], dtype=np.int64)
        if np.any(row_start < 0) or np.any(rows < 0) or np.any(row_start + rows > batch_rows[block_of_pick]):
            raise _corrupt(name, "has a key-group index whose row ranges fall outside their batches")

        # Global row positions of each picked run, then one vectorised take.
        batch_base = np.zeros(len(batches) + 1, dtype=np.int64)
        np.cumsum(batch_rows, out=batch_base[1:])
        starts = batch_base[block_of_pick] + row_start
        total = int(rows.sum())
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
        take = np.repeat(starts, rows) + within
        return _with_kg(table.take(pa.array(take)), name, self._m)

    def _read_batch_index(self, key_groups: np.ndarray) -> pa.Table:
        """read with a row per batch: the batches whose key-group range holds a wanted group, then their rows
        whose key group (derived from the hash) is wanted."""
        index = self.index
        first = index.column("first_kg").to_numpy()
        last = index.column("last_kg").to_numpy()
        at = np.searchsorted(key_groups, first, side="left")
        hit = at < len(key_groups)
        hit[hit] = key_groups[at[hit]] <= last[hit]
        table = self._batch_rows(np.flatnonzero(hit))
        keep = np.isin(table.column("kg").to_numpy(), key_groups)
        return table if keep.all() else table.filter(pa.array(keep))

    def dictionaries(self) -> dict | None:
        """The dictionary of each dictionary column (``dictionaries.leaf_dictionaries``; one per column per
        file, read with the first batch); None for a file of no batches."""
        if not self.batched or not len(self.index):
            return None if not len(self.index) else {}
        if self._head is None:
            return {}
        index = self.index
        [batch] = _fetch_batches(self._fetch, self.name, index.column("offset").to_numpy()[:1],
                                 index.column("length").to_numpy()[:1], index.column("crc").to_numpy()[:1],
                                 self._verify, self.schema, self._head, self._trusted)
        return dictionaries.leaf_dictionaries(batch)

    def batches(self, per_read: int = 8) -> Iterator[pa.Table]:
        """Every row of a typed file, `per_read` batches at a time, in the file's order, with ``kg`` first."""
        if not self.batched:
            raise ValueError(f"{self.name}: only a typed file's batches are read in order")
        for start in range(0, len(self.index), per_read):
            yield self._batch_rows(np.arange(start, min(start + per_read, len(self.index))))

    def _batch_rows(self, pick: np.ndarray) -> pa.Table:
        """The rows of the batch index's rows `pick` (ascending), checked against their row counts."""
        if len(pick) == 0:
            return _with_kg(self.schema.empty_table(), self.name, self._m)
        index = self.index
        offsets = index.column("offset").to_numpy()[pick]
        batches = self._batches_at(offsets, index.column("length").to_numpy()[pick],
                                   index.column("crc").to_numpy()[pick])
        rows = index.column("rows").to_numpy()[pick]
        for off, batch, expected in zip(offsets.tolist(), batches, rows.tolist()):
            if batch.num_rows != expected:
                raise _corrupt(self.name, f"has a batch at byte {off} with {batch.num_rows} rows, its index says "
                                          f"{expected}")
        return _with_kg(pa.Table.from_batches(batches, schema=self.schema), self.name, self._m)

    def _batches_at(self, offsets: np.ndarray, lengths: np.ndarray, crcs: np.ndarray) -> list[pa.RecordBatch]:
        return _fetch_batches(self._fetch, self.name, offsets, lengths, crcs, self._verify, self.schema, self._head,
                              self._trusted)


def _fetch_batches(fetch: Fetch, name: str, block_offsets: np.ndarray, block_lengths: np.ndarray,
                   crcs: np.ndarray, verify: bool, schema: pa.Schema, head: bytes | None,
                   trusted: bool) -> list[pa.RecordBatch]:
    """The record batches at the given (sorted, distinct) byte ranges, adjacent ones fetched as one range,
    each checked against its CRC-32 (`verify`); validated in full unless every byte they are decoded from
    was checked (`trusted`)."""
    ends = block_offsets + block_lengths
    run_first = np.ones(len(block_offsets), dtype=bool)
    run_first[1:] = block_offsets[1:] != ends[:-1]
    run_id = np.cumsum(run_first) - 1
    run_starts = block_offsets[run_first]
    run_ends = np.maximum.reduceat(ends, np.flatnonzero(run_first))
    chunks = fetch(list(zip(run_starts.tolist(), run_ends.tolist())))

    batches = []
    for b, (off, ln) in enumerate(zip(block_offsets.tolist(), block_lengths.tolist())):
        run = run_id[b]
        rel = off - int(run_starts[run])
        block = memoryview(chunks[run])[rel:rel + ln]
        if len(block) != ln:
            raise _corrupt(name, f"is truncated: batch at byte {off} has {len(block)} of {ln} bytes")
        if verify and zlib.crc32(block) != int(crcs[b]):
            raise _corrupt(name, f"has a batch at byte {off} whose CRC-32 does not match its index")
        try:
            batch = _read_batch(block, schema, head)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
            raise _corrupt(name, f"has an undecodable batch at byte {off} ({err})") from None
        if not trusted:
            _validate(batch, name, f"rows in the batch at byte {off}")
        batches.append(batch)
    return batches
