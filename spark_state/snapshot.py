"""The state file format: one (operator, partition, version)'s rows, by key group.

A file is three parts, all little-endian, nothing pickled::

    data     an Arrow IPC *stream* (zstd-compressed buffers) of the rows:
             rows sorted by key group, cut into record batches that hold whole
             key-group runs (a key group bigger than the batch target gets
             batches of its own), then the end-of-stream marker
    index    an Arrow IPC stream of INDEX_SCHEMA: one row per (key group,
             batch): the batch's byte range and CRC-32, and the key group's
             row range inside that batch
    trailer  u64 index offset, u64 index length, 8-byte magic

Two row layouts, told apart by the file's magic and its manifest entry:

* **format 2, typed** (written since spark_state 0.2): ``hash: int32``, ``key``
  and ``value`` as struct columns with the operator's key and value schemas,
  as Spark's own Arrow conversion (``ArrowWriter`` in the JVM shim) maps every
  Spark type. Any Arrow reader (pandas, DuckDB, Polars) can read the rows, and
  typed columns compress far better than opaque row bytes. The key group is
  not stored: it is ``pmod(hash, maxParallelism)``, recomputed on read (the
  index keeps it). A null ``value`` is a delete (only in deltas).
* **format 1, opaque** (CHANGES_SCHEMA): ``kg``, ``hash`` and ``key``/``value``
  as the bytes of Spark's ``UnsafeRow``s. Still read; still written for a store
  whose schema Spark's Arrow conversion cannot map.

Tables in memory always carry ``kg`` first (typed files get it on read).

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
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.keygroups import key_group_order

CHANGES_SCHEMA = pa.schema([("kg", pa.int32()), ("hash", pa.int32()), ("key", pa.binary()), ("value", pa.binary())])
#: The same rows with 64-bit offsets: what a partition holding more than 2 GiB of keys and values is merged as.
LARGE_SCHEMA = pa.schema([("kg", pa.int32()), ("hash", pa.int32()), ("key", pa.large_binary()),
                          ("value", pa.large_binary())])
#: Above this many key+value bytes a table is handled with 64-bit offsets (binary's limit is 2 GiB).
_WIDEN_AT = 1 << 30

INDEX_SCHEMA = pa.schema([
    ("kg", pa.int32()),
    ("offset", pa.int64()),      # byte offset of the batch's IPC message in the file
    ("length", pa.int64()),      # byte length of that message
    ("crc", pa.uint32()),        # CRC-32 of those bytes
    ("row_start", pa.int64()),   # first row of the key group inside the batch
    ("rows", pa.int64()),        # rows of the key group inside the batch
])

#: Opaque UnsafeRow bytes (CHANGES_SCHEMA) and typed struct columns (see the module docstring).
OPAQUE_FORMAT = 1
TYPED_FORMAT = 2
FILE_FORMAT_VERSION = TYPED_FORMAT
MAGIC = b"SPKST\x00\x00\x02"  # last byte = file format version
_MAGICS = {fmt: MAGIC[:-1] + bytes([fmt]) for fmt in (OPAQUE_FORMAT, TYPED_FORMAT)}
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
    file_format: int = OPAQUE_FORMAT

    @property
    def size(self) -> int:
        return len(self.data)


def empty_table(like: pa.Schema | pa.Table | None = None) -> pa.Table:
    """No rows, with `like`'s schema (default: the opaque CHANGES_SCHEMA)."""
    if like is None:
        return CHANGES_SCHEMA.empty_table()
    return (like if isinstance(like, pa.Schema) else like.schema).empty_table()


def is_typed(table: pa.Table | pa.Schema) -> bool:
    """Whether rows carry key and value as struct columns (file format 2) rather than row bytes."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    return pa.types.is_struct(schema.field("key").type)


def typed_schema(key: pa.DataType, value: pa.DataType) -> pa.Schema:
    """The in-memory schema of typed rows: kg, hash, key, value (value nullable: null = delete)."""
    return pa.schema([("kg", pa.int32()), ("hash", pa.int32()), pa.field("key", key, nullable=False),
                      ("value", value)])


def conform(table: pa.Table) -> pa.Table:
    """Checks a changes/state table has kg, hash, key, value and casts it to exactly CHANGES_SCHEMA (opaque;
    LARGE_SCHEMA when its key/value already have 64-bit offsets) or, when key and value are structs, to
    int32 kg and hash with the structs as they are (typed)."""
    missing = [f.name for f in CHANGES_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"changes table lacks column(s) {missing}; expected {CHANGES_SCHEMA}")
    table = table.select(CHANGES_SCHEMA.names)
    if is_typed(table):
        if not pa.types.is_struct(table.schema.field("value").type):
            raise ValueError(f"typed changes need struct key and value columns, got {table.schema}")
        target = typed_schema(table.schema.field("key").type, table.schema.field("value").type)
        return table if table.schema == target else table.cast(target)
    target = LARGE_SCHEMA if table.schema.field("key").type == pa.large_binary() else CHANGES_SCHEMA
    if table.schema != target:
        table = table.cast(target)
    return table


def _payload_bytes(table: pa.Table) -> int:
    return sum(table.column(name).nbytes for name in ("key", "value"))


def widen(table: pa.Table) -> pa.Table:
    """The table with 64-bit offsets (a cast of the offsets; the bytes are not copied)."""
    return table if table.schema == LARGE_SCHEMA else conform(table).cast(LARGE_SCHEMA)


def narrow(table: pa.Table) -> pa.Table:
    """Back to CHANGES_SCHEMA where the rows fit 32-bit offsets; a table too big for that stays wide."""
    if table.schema == LARGE_SCHEMA and _payload_bytes(table) < _WIDEN_AT:
        return table.cast(CHANGES_SCHEMA)
    return table


def binary_batches(table: pa.Table, max_rows: int = 65536):
    """Record batches of CHANGES_SCHEMA (what the JVM shim reads), whatever the table's offsets."""
    for batch in table.to_batches(max_chunksize=max_rows):
        yield batch if batch.schema == CHANGES_SCHEMA else batch.cast(CHANGES_SCHEMA)


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
           target_batch_bytes: int = TARGET_BATCH_BYTES) -> EncodedFile:
    """Serialises rows (typed, or opaque CHANGES_SCHEMA) into one state file; sorts by key group unless told
    they are. Typed rows are stored without ``kg`` (see the module docstring)."""
    table = conform(table)
    typed = is_typed(table)
    if not typed and _payload_bytes(table) >= _WIDEN_AT:
        table = widen(table)   # sorting concatenates; binary offsets would overflow past 2 GiB
    table = table.combine_chunks()
    if not sorted_by_kg and table.num_rows > 1:
        kg = table.column("kg").to_numpy()
        if np.any(kg[1:] < kg[:-1]):
            table = table.take(key_group_order(kg))
    n = table.num_rows
    kg = table.column("kg").to_numpy()
    if n:
        if typed:   # struct columns have no per-row length: spread their bytes evenly
            row_bytes = np.full(n, _payload_bytes(table) // n + _ROW_OVERHEAD, dtype=np.int64)
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
    stored = table.drop_columns(["kg"]) if typed else table
    schema = stored.schema if typed else CHANGES_SCHEMA
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for start, rows in zip(batch_first.tolist(), batch_rows.tolist()):
            part = stored.slice(start, rows)
            writer.write_table(part if part.schema == schema else part.cast(schema))
    data = sink.getvalue()

    # Byte range of each batch message: walk the stream's message framing (no decoding).
    src = pa.BufferReader(data)
    reader = pa.ipc.MessageReader.open_stream(src)
    bounds = []
    while True:
        try:
            reader.read_next_message()
        except StopIteration:
            break
        bounds.append(src.tell())
    offsets = np.asarray(bounds[:-1], dtype=np.int64)   # first message is the schema
    lengths = np.diff(np.asarray(bounds, dtype=np.int64))
    view = memoryview(data)
    crcs = np.fromiter((zlib.crc32(view[o:o + ln]) for o, ln in zip(offsets.tolist(), lengths.tolist())),
                       dtype=np.uint32, count=len(offsets))

    # One index row per (key group, batch) run.
    if n:
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
    index_sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(index_sink, INDEX_SCHEMA, options=options) as writer:
        writer.write_table(index)
    index_bytes = index_sink.getvalue()
    index_offset = data.size
    file_format = TYPED_FORMAT if typed else OPAQUE_FORMAT
    trailer = _TRAILER.pack(index_offset, index_bytes.size, _MAGICS[file_format])
    blob = b"".join((view, memoryview(index_bytes), trailer))
    return EncodedFile(blob, n, crc32_hex(blob), index_offset, index_bytes.size, crc32_hex(index_bytes),
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
    if magic[:-1] != MAGIC[:-1] or magic[-1] < OPAQUE_FORMAT:
        raise _corrupt(name, "does not end with the spark_state file magic")
    if magic[-1] > FILE_FORMAT_VERSION:
        raise FormatVersionError(
            f"state file {name} has file format version {magic[-1]}, newer than the {FILE_FORMAT_VERSION} "
            f"this spark_state reads; upgrade spark_state on the executors."
        )
    return offset, length


def decode(data, name: str, max_parallelism: int | None = None) -> pa.Table:
    """All rows of a whole file (its data part is a plain Arrow IPC stream), with ``kg`` first.

    Typed files do not store ``kg``; it is recomputed from ``hash`` with `max_parallelism`.
    """
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise _corrupt(name, f"cannot be decoded ({err})") from None
    return _with_kg(table, name, max_parallelism)


def _check_stored_schema(schema: pa.Schema, name: str) -> None:
    if schema == CHANGES_SCHEMA:
        return
    if (schema.names != ["hash", "key", "value"] or schema.field("hash").type != pa.int32()
            or not pa.types.is_struct(schema.field("key").type) or not pa.types.is_struct(schema.field("value").type)):
        raise _corrupt(name, f"has schema {schema}, expected {CHANGES_SCHEMA} or typed hash, key, value")


def _with_kg(table: pa.Table, name: str, max_parallelism: int | None) -> pa.Table:
    _check_stored_schema(table.schema, name)
    if "kg" in table.column_names:
        return table
    if max_parallelism is None:
        raise ValueError(f"reading typed state file {name} needs the max parallelism to derive key groups")
    from spark_state.keygroups import key_groups_of

    return table.add_column(0, "kg", pa.array(key_groups_of(table.column("hash"), max_parallelism), pa.int32()))


def decode_index(data, name: str, checksum: str | None) -> pa.Table:
    if checksum is not None and crc32_hex(data) != checksum:
        raise _corrupt(name, f"has a key-group index with checksum {crc32_hex(data)}, expected {checksum}")
    try:
        index = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise _corrupt(name, f"has an unreadable key-group index ({err})") from None
    if index.schema != INDEX_SCHEMA:
        raise _corrupt(name, "has a key-group index with an unexpected schema")
    return index


def _read_schema(fetch: Fetch, name: str, end: int) -> pa.Schema:
    """The stream's schema: its first message, in bytes [0, end)."""
    (head,) = fetch([(0, end)])
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(head))
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise _corrupt(name, f"has an unreadable schema ({err})") from None
    _check_stored_schema(schema, name)
    return schema


def read_key_groups(fetch: Fetch, name: str, index_offset: int, index_length: int, index_checksum: str | None,
                    key_groups: np.ndarray, verify: bool = True, *, file_format: int = OPAQUE_FORMAT,
                    max_parallelism: int | None = None) -> pa.Table:
    """Rows of the given key groups (sorted int32 array), reading only the index and their batches
    (and, for a typed file, the schema message at its start)."""
    (index_bytes,) = fetch([(index_offset, index_offset + index_length)])
    index = decode_index(index_bytes, name, index_checksum if verify else None)
    kg = index.column("kg").to_numpy()
    pick = np.flatnonzero(np.isin(kg, key_groups))
    schema = CHANGES_SCHEMA
    if file_format != OPAQUE_FORMAT:
        all_offsets = index.column("offset").to_numpy()
        schema = _read_schema(fetch, name, int(all_offsets.min()) if len(all_offsets) else index_offset)
    if len(pick) == 0:
        return _with_kg(schema.empty_table(), name, max_parallelism)
    offsets = index.column("offset").to_numpy()[pick]
    lengths = index.column("length").to_numpy()[pick]
    crcs = index.column("crc").to_numpy()[pick]
    row_start = index.column("row_start").to_numpy()[pick]
    rows = index.column("rows").to_numpy()[pick]

    block_offsets, first_pick, block_of_pick = np.unique(offsets, return_index=True, return_inverse=True)
    block_lengths = lengths[first_pick]
    # Coalesce adjacent batches into one range request each.
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
        if verify and zlib.crc32(block) != int(crcs[first_pick[b]]):
            raise _corrupt(name, f"has a batch at byte {off} whose CRC-32 does not match its index")
        try:
            batches.append(pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(block)), schema))
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
            raise _corrupt(name, f"has an undecodable batch at byte {off} ({err})") from None
    table = pa.Table.from_batches(batches, schema=schema)

    # Global row positions of each picked run, then one vectorised take.
    batch_base = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum([b.num_rows for b in batches], out=batch_base[1:])
    starts = batch_base[block_of_pick] + row_start
    total = int(rows.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
    take = np.repeat(starts, rows) + within
    return _with_kg(table.take(pa.array(take)), name, max_parallelism)
