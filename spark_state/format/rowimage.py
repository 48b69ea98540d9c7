"""Row images: state files the JVM looks keys up in directly (issue 23), without decoding any row.

(Over 400 lines on purpose: the spec, the writer and the reader of one byte layout stay in one module,
so a change to the bytes is made, and reviewed, in one place.)

A row image holds one store's rows as Spark's own ``UnsafeRow`` bytes, sorted by (key group, hash), in
small independently compressed blocks behind a block index: a get is one binary search in the index,
one block decompression and a scan of ~100 records. The worker writes one beside each typed snapshot
(derived from it, so the two cannot disagree); the JVM writes them as spill runs. All integers
little-endian::

    [block 0] ... [block B-1] [index: B entries of 40 bytes] [filter words] [filter header]
    [page directory: P entries of 32 bytes] [directory header] [trailer: 40 bytes]

record     i32 kg (key group, pmod(hash, maxParallelism)), i32 hash (Spark's Murmur3 of the key),
           i32 keyLength, i32 valueLength (-1: a tombstone, the key is deleted, no value bytes),
           then the key's UnsafeRow bytes (byte-identical to Spark's UnsafeProjection: lookups compare
           them) and the value's. Both lengths are multiples of 8, so every record starts 8-aligned.
order      ascending *sort key* ``kg * 2**32 + (hash as unsigned 32-bit)``; equal sort keys in any
           order; a key at most once per file.
block      records packed while the block's raw size stays <= blockBytes (default 4 KiB; a larger
           record gets a block of its own; no record is split), stored as one zstd frame (codec 1)
           or raw (codec 0); blocks follow each other from byte 0 with no gaps.
index      per block: u64 firstSortKey, u64 lastSortKey, u64 offset, u32 storedLength,
           u32 rawLength, u32 crc32 (zlib's CRC-32 of the stored bytes), u32 records.
filter     (format version 2, flag ``FILTER``) W u64 words of a Bloom filter over the records' hashes
           (``spark_state.format.keyfilter``: W = max(1, ceil(10 * records / 64)), k = 7), then a
           16-byte header: u32 W, u32 k (1..30), u32 crc32 of the words, u32 reserved (0).
directory  (format version 3, flag ``PAGED``) the index cut into pages of E consecutive entries (the last
           may be shorter), P = ceil(B / E): per page u64 firstSortKey of its first block, u64 lastSortKey
           of its last, u64 offset of its first block, u32 crc32 of the page's index bytes, u32 records
           of its blocks; then a 16-byte header: u32 P, u32 E, u32 crc32 of the entries followed by the
           header's first 8 bytes (P and E), u32 reserved (0).
           A reader by byte range opens the image from the file's last few KiB (directory, headers,
           trailer) and reads an index page, checked by its own CRC, when a lookup first needs it: the
           open costs the same at a thousand keys or a hundred million (issue 38).
trailer    u64 indexOffset, u64 records, u32 blockCount, u32 indexCrc32 (of the whole index), u32 codec,
           u32 flags (bit 0 ``TOMBSTONES``: the file holds tombstones, snapshot images never do; bit 1
           ``FILTER``: the filter is there; bit 2 ``PAGED``: the directory is there), then the magic
           ``SPKSTRI`` and the format version byte (3; 2 has no directory, 1 no filter either). This
           writer always writes version 3 with a filter and a directory; the JVM's spill runs, read only
           from a local disk, are version 2.

A reader checks the magic and version (a newer version is a FormatVersionError: upgrade spark_state),
that trailer, index, filter and blocks add up to the file's size, the index's and the filter's CRCs
before using them, and each block's CRC before decompressing it (when verifying); anything else is a
ChecksumMismatch naming the file and the block. The filter header's k has no CRC of its own (a k
raised by a flipped bit would make the filter deny keys it holds), so a reader also asks the filter for
the hashes of every block's first and last record, which the index names: a filter that denies one is
damaged. The whole file's CRC-32 and size go into the manifest entry that names it.

Lookup of a key (kg, hash h, key bytes k): when the filter says h is not there, absent; else
s = kg * 2**32 + (h & 0xFFFFFFFF); binary-search the first block whose lastSortKey >= s; scan blocks
from there while firstSortKey <= s, in each the records while their sort key <= s, comparing keyLength
and key bytes of those whose sort key == s. Found with valueLength >= 0: the value; with -1: deleted;
not found: absent from this file.

Writing is vectorised: keys and values are encoded straight into each chunk of blocks
(``spark_state.format.unsaferow``), compressed block by block; only the block cuts walk block by block
(packing "while it fits" is a recurrence: one binary search per block, never a loop per row).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import zstandard

from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.format import tables, unsaferow
from spark_state.format.datafile import crc32_hex
from spark_state.format.keyfilter import MAX_K, FilterBuilder, KeyFilter

MAGIC = b"SPKSTRI"
#: The format version this code writes, and the newest it reads (1: no key filter; 2: no page directory).
VERSION = 3
RAW, ZSTD = 0, 1
#: Trailer flags: the file holds tombstones (records with valueLength -1); the key filter is there (version 2);
#: the index's page directory is there (version 3).
TOMBSTONES = 1
FILTER = 2
PAGED = 4
_FLAGS = {1: TOMBSTONES, 2: TOMBSTONES | FILTER, 3: TOMBSTONES | FILTER | PAGED}   # the flags each version knows
BLOCK_BYTES = 4 * 1024
HEADER_BYTES = 16
INDEX_ENTRY = np.dtype([("first", "<u8"), ("last", "<u8"), ("offset", "<u8"), ("stored", "<u4"),
                        ("raw", "<u4"), ("crc", "<u4"), ("records", "<u4")])
_TRAILER = struct.Struct("<QQIIII7sB")
TRAILER_BYTES = _TRAILER.size
_HEADER = struct.Struct("<iiii")
_FILTER_HEADER = struct.Struct("<IIII")   # W, k, crc32 of the words, reserved
FILTER_HEADER_BYTES = _FILTER_HEADER.size


def _page_entries() -> int:
    """Index entries per page of the directory: 1,024 (40 KiB of index, one range request of a reader), or
    fewer where a test that needs many pages of a small image sets SPARK_STATE_IMAGE_PAGE_ENTRIES (a value
    that is not a positive integer is ignored)."""
    value = os.environ.get("SPARK_STATE_IMAGE_PAGE_ENTRIES", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1024


#: Index entries per page of the directory (version 3).
PAGE_ENTRIES = _page_entries()
PAGE_ENTRY = np.dtype([("first", "<u8"), ("last", "<u8"), ("offset", "<u8"), ("crc", "<u4"), ("records", "<u4")])
_PAGES_HEADER = struct.Struct("<IIII")    # P, E, crc32 of the entries and of P and E, reserved
PAGES_HEADER_BYTES = _PAGES_HEADER.size
#: Raw bytes of records encoded at once (whole blocks): bounds the encoder's memory whatever the file size.
CHUNK_BYTES = 8 * 1024 * 1024

assert INDEX_ENTRY.itemsize == 40 and TRAILER_BYTES == 40 and PAGE_ENTRY.itemsize == 32


def page_directory(index: np.ndarray, index_bytes: bytes, per_page: int) -> np.ndarray:
    """The directory of an index (version 3): per page of ``per_page`` entries, its first and last sort keys,
    its first block's offset, the CRC-32 of its bytes and its record count."""
    pages = -(-len(index) // per_page)
    out = np.zeros(pages, dtype=PAGE_ENTRY)
    step = per_page * INDEX_ENTRY.itemsize
    for p in range(pages):
        entries = index[p * per_page:(p + 1) * per_page]
        out[p] = (entries["first"][0], entries["last"][-1], entries["offset"][0],
                  zlib.crc32(index_bytes[p * step:(p + 1) * step]), int(entries["records"].sum()))
    return out



def sort_keys(kg: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """``kg * 2**32 + (hash as unsigned)`` as uint64: the order of a row image's records."""
    return (np.asarray(kg).astype(np.uint64) << np.uint64(32)) | np.asarray(hashes, np.int32).view(np.uint32)


def sort_key(kg: int, h: int) -> int:
    return (kg << 32) | (h & 0xFFFFFFFF)


# ------------------------------------------------------------------ writing

@dataclass(frozen=True)
class WrittenImage:
    """What a manifest entry records about a row image (``ImageWriter.finish``)."""

    rows: int
    size: int
    checksum: str
    blocks: int
    tombstones: bool
    filter_words: int
    #: the file's last bytes, which a reader by range needs before its first lookup (``Tail``): filter header,
    #: page directory and its header, trailer
    tail: bytes = b""


@dataclass(frozen=True)
class EncodedImage:
    """A serialised row image and what its manifest entry records about it."""

    data: bytes
    rows: int
    checksum: str
    blocks: int
    tombstones: bool
    filter_words: int = 0
    tail: bytes = b""   # as WrittenImage.tail

    @property
    def size(self) -> int:
        return len(self.data)


def encode(table: pa.Table, *, block_bytes: int = BLOCK_BYTES, level: int = 1, codec: int = ZSTD,
           threads: int = 0) -> EncodedImage:
    """The row image of a table of ``kg, hash, key, value`` rows: typed (struct key and value, see
    spark_state.format.datafile) or opaque (UnsafeRow bytes); a null value is a tombstone. Keys must be
    distinct. ``level``: zstd's (negative: faster). ``threads`` > 0 compresses chunks of blocks on that
    many threads while the caller's thread encodes the next chunks (zstd and most numpy release the GIL);
    the bytes are the same either way."""
    pieces: list[bytes] = []
    writer = ImageWriter(pieces.append, block_bytes=block_bytes, level=level, codec=codec, threads=threads)
    writer.add(table)
    done = writer.finish()
    return EncodedImage(b"".join(pieces), done.rows, done.checksum, done.blocks, done.tombstones, done.filter_words,
                        done.tail)


class ImageWriter:
    """A row image written as its rows come, a key-group range at a time (compaction never holds a partition's
    rows whole): ``add`` the ranges in ascending sort-key order, a key in one of them only, then ``finish``.
    Each ``add`` hands its finished blocks' bytes to ``out`` at once and keeps only its unfinished last block
    (the next rows may still fill it: blocks are packed greedily across ranges, as if the rows came at once)
    and what the index and the filter need: 40 bytes per block and 4 bytes per record (the hashes; the filter's
    size depends on the file's record count, known at ``finish``)."""

    def __init__(self, out: Callable[[bytes], None], *, block_bytes: int = BLOCK_BYTES, level: int = 1,
                 codec: int = ZSTD, threads: int = 0):
        if codec not in (RAW, ZSTD):
            raise ValueError(f"codec must be {RAW} (raw) or {ZSTD} (zstd), got {codec}")
        if block_bytes < HEADER_BYTES:
            raise ValueError(f"block_bytes must be at least {HEADER_BYTES}, got {block_bytes}")
        self._out, self._block_bytes, self._level, self._codec, self._threads = out, block_bytes, level, codec, threads
        self._index: list[np.ndarray] = []
        self._hashes: list[np.ndarray] = []
        self._carry: _Carry | None = None   # the records of the unfinished last block
        self._size = self._crc = self._rows = 0
        self._tombstones = False
        self._last: int | None = None     # sort key of the last record added

    def _emit(self, data) -> None:
        self._out(data)
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)

    def add(self, table: pa.Table) -> None:
        """The rows of one key-group range (in any order within it; after every range added before)."""
        layout = _Layout(table, self._block_bytes, self._carry)
        if not layout.n:
            return
        first = int(layout.new_sk[0])
        if self._last is not None and first < self._last:
            raise ValueError(f"rows added to a row image out of sort-key order (key group {first >> 32} after "
                             f"{self._last >> 32})")
        self._last = int(layout.new_sk[-1])
        self._hashes.append((layout.new_sk & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        self._rows += layout.n
        self._tombstones |= not layout.new_live.all()
        blocks = len(layout.first)
        self._write_blocks(layout, blocks - 1)
        self._carry = layout.carry(blocks - 1)

    def _write_blocks(self, layout: "_Layout", blocks: int) -> None:
        """Compresses and writes blocks [0, blocks) of `layout`, recording their index entries."""
        if blocks <= 0:
            return
        index = layout.index(blocks)
        for b0, b1, stored in _stored(layout.chunks(blocks), self._codec, self._level, self._threads):
            for b, (block, crc) in zip(range(b0, b1), stored):
                index[b]["offset"], index[b]["stored"], index[b]["crc"] = self._size, len(block), crc
                self._emit(block)
        self._index.append(index)

    def finish(self) -> WrittenImage:
        """Writes the last block, the index, the key filter and the trailer; what the manifest records."""
        if self._carry is not None:
            layout = _Layout(None, self._block_bytes, self._carry)
            self._write_blocks(layout, len(layout.first))
            self._carry = None
        index = np.concatenate(self._index) if self._index else np.zeros(0, dtype=INDEX_ENTRY)
        index_offset = self._size
        index_bytes = index.tobytes()
        builder = FilterBuilder(self._rows)
        while self._hashes:   # part by part, each let go once its bits are set: never a copy of them all
            builder.add(self._hashes.pop())
        key_filter = builder.finish()
        filter_bytes = key_filter.to_bytes()
        flags = FILTER | PAGED | (TOMBSTONES if self._tombstones else 0)
        directory = page_directory(index, index_bytes, PAGE_ENTRIES).tobytes()
        self._emit(index_bytes)
        self._emit(filter_bytes)
        pages = len(directory) // PAGE_ENTRY.itemsize
        tail = b"".join((
            _FILTER_HEADER.pack(len(key_filter.words), key_filter.k, zlib.crc32(filter_bytes), 0),
            directory,
            _PAGES_HEADER.pack(pages, PAGE_ENTRIES, _directory_crc(directory, pages, PAGE_ENTRIES), 0),
            _TRAILER.pack(index_offset, self._rows, len(index), zlib.crc32(index_bytes), self._codec, flags, MAGIC,
                          VERSION)))
        self._emit(tail)
        return WrittenImage(self._rows, self._size, f"crc32:{self._crc:08x}", len(index), self._tombstones,
                            len(key_filter.words), tail)


class _Carry(NamedTuple):
    """Records already laid out that a block still being filled holds: their bytes, sizes and sort keys."""

    raw: np.ndarray     # uint8, the records back to back
    sizes: np.ndarray   # int64 bytes of each record
    sk: np.ndarray      # uint64 sort keys


class _Layout:
    """Where every record of an image goes: the rows in sort-key order after any `carry` (records of an
    unfinished block from before), each record's size and offset, and the block cuts; then the records'
    bytes, a chunk of whole blocks at a time. Indices of records are over carry + new rows."""

    def __init__(self, table: pa.Table | None, block_bytes: int, carry: _Carry | None = None):
        self.carry_raw = carry.raw if carry is not None else np.zeros(0, dtype=np.uint8)
        self.nc = nc = 0 if carry is None else len(carry.sizes)
        if table is not None:
            self._lay_out(table)
        else:
            self.n, self.order = 0, None
            self.new_sk = np.zeros(0, dtype=np.uint64)
            self.new_live = np.ones(0, dtype=bool)
            self.key_len = self.value_len = np.zeros(0, dtype=np.int64)
        sizes = HEADER_BYTES + self.key_len + np.maximum(self.value_len, 0)
        if nc:
            sizes = np.concatenate([carry.sizes, sizes])
            self.sk = np.concatenate([carry.sk, self.new_sk])
        else:
            self.sk = self.new_sk
        self.sizes = sizes
        self.cum = np.zeros(len(sizes) + 1, dtype=np.int64)   # byte offset of each record in the raw stream
        np.cumsum(sizes, out=self.cum[1:])
        self.first = _block_starts(self.cum, block_bytes)
        self.ends = np.append(self.first[1:], len(sizes)) if len(sizes) else self.first

    def _lay_out(self, table: pa.Table) -> None:
        table = tables.conform(table)
        if tables.needs_wide([table]):   # 32-bit offsets cannot hold the concatenated column
            table = tables.widen_typed(table) if tables.is_typed(table) else tables.widen(table)
        self.keys = unsaferow.rows(table.column("key"))
        self.values = unsaferow.rows(table.column("value"))
        if self.keys.valid() is not None:
            raise ValueError("a row image's keys cannot be null")
        kg = table.column("kg").to_numpy()
        if len(kg) and kg.min() < 0:
            raise ValueError(f"key group {int(kg.min())} is negative: key groups are pmod(hash, maxParallelism)")
        self.new_sk = sort_keys(kg, table.column("hash").to_numpy())
        self.n = n = len(self.new_sk)
        self.order = None   # table row of each new record; None: the table is in sort-key order already
        if n > 1 and np.any(self.new_sk[1:] < self.new_sk[:-1]):
            self.order = np.argsort(self.new_sk, kind="stable")   # equal sort keys: in the order given
            self.new_sk = self.new_sk[self.order]
        self._check_distinct()
        live = self.values.valid()
        self.new_live = np.ones(n, dtype=bool) if live is None else live if self.order is None else live[self.order]
        self.key_len = self.keys.sizes(self.order)
        self.value_len = np.full(n, -1, dtype=np.int64)
        self.value_len[self.new_live] = self.values.sizes(self.rows(0, n)[self.new_live])

    def rows(self, q0: int, q1: int) -> np.ndarray:
        """Table rows of new records [q0, q1)."""
        return np.arange(q0, q1, dtype=np.int64) if self.order is None else self.order[q0:q1]

    def _check_distinct(self) -> None:
        """Refuses a key given twice (a lookup would find one of its rows). Only rows sharing a sort key
        (key group and hash) can be equal: those few are compared by their UnsafeRow bytes."""
        sk = self.new_sk
        same = np.flatnonzero(sk[1:] == sk[:-1])
        if not len(same):
            return
        records = np.unique(np.concatenate([same, same + 1]))
        idx = self.rows(0, self.n)[records]
        starts = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(self.keys.sizes(idx), out=starts[1:])
        data = np.zeros(int(starts[-1]), dtype=np.uint8)
        self.keys.write(data, starts[:-1], idx)
        seen = set()
        for r, a, b in zip(records.tolist(), starts[:-1].tolist(), starts[1:].tolist()):
            s = int(sk[r])
            if (s, data[a:b].tobytes()) in seen:
                raise ValueError(f"a key appears twice (key group {s >> 32}, hash "
                                 f"{np.uint32(s & 0xFFFFFFFF).view(np.int32)}): a row image holds each key once")
            seen.add((s, data[a:b].tobytes()))

    def index(self, blocks: int) -> np.ndarray:
        """Blocks [0, blocks)' index entries, but for where each is stored (known once it is compressed)."""
        first, ends = self.first[:blocks], self.ends[:blocks]
        index = np.zeros(blocks, dtype=INDEX_ENTRY)
        index["first"], index["last"] = self.sk[first], self.sk[ends - 1]
        index["raw"] = self.cum[ends] - self.cum[first]
        index["records"] = ends - first
        return index

    def chunks(self, blocks: int) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
        """(b0, b1, raw bytes, each block's offset in them, each block's length) for runs of whole blocks
        [b0, b1) of about CHUNK_BYTES (at least one block each), blocks [0, blocks) in all."""
        cum, first, ends = self.cum, self.first[:blocks], self.ends[:blocks]
        b0 = 0
        while b0 < blocks:
            b1 = max(int(np.searchsorted(cum[ends], cum[first[b0]] + CHUNK_BYTES, side="right")), b0 + 1)
            r0, r1 = int(first[b0]), int(ends[b1 - 1])
            yield b0, b1, self.records(r0, r1), cum[first[b0:b1]] - cum[r0], cum[ends[b0:b1]] - cum[first[b0:b1]]
            b0 = b1

    def records(self, r0: int, r1: int) -> np.ndarray:
        """The raw bytes of records [r0, r1) (carried records first, then new ones)."""
        nc = self.nc
        carried = self.carry_raw[self.cum[min(r0, nc)]:self.cum[min(r1, nc)]]
        if r1 <= nc:
            return carried
        new = self._new_records(max(r0, nc) - nc, r1 - nc)
        return new if not len(carried) else np.concatenate([carried, new])

    def _new_records(self, q0: int, q1: int) -> np.ndarray:
        """The raw bytes of new records [q0, q1): each header, then the key's and the value's UnsafeRow."""
        cum = self.cum[self.nc:] - self.cum[self.nc]
        raw = np.zeros(int(cum[q1] - cum[q0]), dtype=np.uint8)
        words = raw.view(np.uint64)
        at = cum[q0:q1] - cum[q0]
        sk = self.new_sk[q0:q1]
        # header words, little-endian: (kg, hash) is the sort key's halves swapped; then (keyLength, valueLength)
        words[at >> 3] = (sk >> np.uint64(32)) | ((sk & np.uint64(0xFFFFFFFF)) << np.uint64(32))
        klen, vlen = self.key_len[q0:q1], self.value_len[q0:q1]
        words[(at >> 3) + 1] = klen.astype(np.uint64) | (vlen.astype(np.uint32).astype(np.uint64) << np.uint64(32))
        idx = self.rows(q0, q1)
        self.keys.write(raw, at + HEADER_BYTES, idx)
        live = self.new_live[q0:q1]
        self.values.write(raw, (at + HEADER_BYTES + klen)[live], idx[live])
        return raw

    def carry(self, block: int) -> _Carry | None:
        """Block `block` (the last) as the records a later ``add`` may add to; None without one."""
        if block < 0 or block >= len(self.first):
            return None
        r0, r1 = int(self.first[block]), int(self.ends[block])
        return _Carry(self.records(r0, r1), self.sizes[r0:r1].copy(), self.sk[r0:r1].copy())


def _block_starts(cum: np.ndarray, block_bytes: int) -> np.ndarray:
    """First record of each block: greedy packing while the block's raw size stays <= block_bytes,
    one binary search per block over the records' cumulative sizes."""
    n = len(cum) - 1
    starts, i = [], 0
    while i < n:
        starts.append(i)
        j = int(np.searchsorted(cum, cum[i] + block_bytes, side="right")) - 1   # last boundary that fits
        i = max(j, i + 1)
    return np.asarray(starts, dtype=np.int64)


def _compress(codec: int, level: int, raw: np.ndarray, cuts: np.ndarray, lengths: np.ndarray) -> list:
    """Each block of a chunk as stored (raw bytes, or one zstd frame), with its CRC-32."""
    view = memoryview(raw)
    bounds = zip(cuts.tolist(), (cuts + lengths).tolist())
    if codec == RAW:
        stored = [bytes(view[a:b]) for a, b in bounds]
    else:
        compressor = zstandard.ZstdCompressor(level=level, write_checksum=False)   # one per thread
        stored = [compressor.compress(view[a:b]) for a, b in bounds]
    return [(block, zlib.crc32(block)) for block in stored]


def _stored(chunks, codec: int, level: int, threads: int):
    """(b0, b1, stored blocks) per chunk, in order; with threads, compressed on a pool that keeps up to
    ``threads`` chunks in flight while the next ones are encoded."""
    if threads <= 0:
        for b0, b1, raw, cuts, lengths in chunks:
            yield b0, b1, _compress(codec, level, raw, cuts, lengths)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="rowimage-zstd") as pool:
        pending = deque()
        for b0, b1, raw, cuts, lengths in chunks:
            pending.append((b0, b1, pool.submit(_compress, codec, level, raw, cuts, lengths)))
            if len(pending) > threads:
                b0, b1, done = pending.popleft()
                yield b0, b1, done.result()
        while pending:
            b0, b1, done = pending.popleft()
            yield b0, b1, done.result()


# ------------------------------------------------------------------ reading

class Record(NamedTuple):
    kg: int
    hash: int
    key: bytes
    value: bytes | None   # None: a tombstone


#: What ``lookup`` returns for a key a file holds as deleted (absent keys give None).
DELETED = object()


def _directory_crc(entries: bytes, pages: int, per_page: int) -> int:
    """The directory's CRC-32: its entries, then P and E (a flipped P or E is caught like a flipped entry)."""
    return zlib.crc32(struct.pack("<II", pages, per_page), zlib.crc32(entries))


def _check_pages_header(name: str, header: tuple[int, int, int, int]) -> tuple[int, int, int]:
    pages, per_page, crc, reserved = header
    if per_page < 1 or reserved != 0:
        raise _corrupt(name, f"has a directory header of {pages} pages of {per_page} entries and reserved "
                             f"{reserved:#x}, which no writer made")
    return pages, per_page, crc


def _corrupt(name: str, why: str) -> ChecksumMismatch:
    return ChecksumMismatch(
        f"row image {name} {why}; it is corrupted or truncated. It is derived state: rebuild it (or read "
        f"the snapshot it was made from) — its rows cannot be trusted.")


class RowImage:
    """A row image opened for lookups and scans: trailer and index read and checked once, blocks read
    (by byte range when ``source`` is a Fetch) and checked when used."""

    def __init__(self, source, name: str, *, size: int | None = None, verify: bool = True):
        self.name = name
        self.verify = verify
        if callable(source):
            if size is None:
                raise ValueError(f"reading row image {name} by byte ranges needs its size")
            self._fetch = source
        else:
            whole = memoryview(source).cast("B")
            size = len(whole) if size is None else size
            self._fetch = lambda ranges: [whole[a:b] for a, b in ranges]
        self.size = size
        if size < TRAILER_BYTES:
            raise _corrupt(name, f"has {size} bytes, fewer than its {TRAILER_BYTES}-byte trailer")
        (trailer,) = self._read([(size - TRAILER_BYTES, size)])
        index_offset, self.rows, blocks, index_crc, self.codec, flags, magic, version = _TRAILER.unpack(trailer)
        if magic != MAGIC:
            raise _corrupt(name, "does not end with the row image magic")
        if version > VERSION:
            raise FormatVersionError(f"row image {name} has format version {version}, newer than the {VERSION} "
                                     f"this spark_state reads; upgrade spark_state on the executors.")
        if version < 1 or self.codec not in (RAW, ZSTD) or flags & ~_FLAGS[version]:
            raise _corrupt(name, f"has format version {version}, codec {self.codec} and flags {flags:#x}, "
                                 f"which no writer made")
        self.version = version
        self.tombstones = bool(flags & TOMBSTONES)
        index_end = index_offset + blocks * INDEX_ENTRY.itemsize
        pages, per_page, pages_crc = self._pages_header(size) if flags & PAGED else (0, 0, 0)
        directory_bytes = (PAGE_ENTRY.itemsize * pages + PAGES_HEADER_BYTES) if flags & PAGED else 0
        filter_words, k, filter_crc = self._filter_header(size - directory_bytes) if flags & FILTER else (0, 0, 0)
        filter_end = index_end + (8 * filter_words + FILTER_HEADER_BYTES if flags & FILTER else 0)
        if filter_end + directory_bytes + TRAILER_BYTES != size:
            raise _corrupt(name, f"has {size} bytes, but its trailer puts {blocks} index entries at byte "
                                 f"{index_offset}" + (f", followed by a filter of {filter_words} words"
                                                      if flags & FILTER else "")
                           + (f" and a directory of {pages} pages" if flags & PAGED else ""))
        (index_bytes,) = self._read([(index_offset, index_end)])
        if zlib.crc32(index_bytes) != index_crc:
            raise _corrupt(name, "has a block index whose CRC-32 does not match its trailer")
        self.index = np.frombuffer(bytes(index_bytes), dtype=INDEX_ENTRY)
        self._check_index(index_offset)
        if flags & PAGED:
            (directory,) = self._read([(filter_end, filter_end + PAGE_ENTRY.itemsize * pages)])
            if _directory_crc(directory, pages, per_page) != pages_crc:
                raise _corrupt(name, "has a page directory whose CRC-32 does not match its header")
            if bytes(directory) != page_directory(self.index, bytes(index_bytes), per_page).tobytes():
                raise _corrupt(name, "has a page directory that does not describe its block index")
        #: the key filter (None: a version-1 file, or one written without it: every key is looked up)
        self.filter = None if not flags & FILTER else self._filter(index_end, filter_words, k, filter_crc)

    def _pages_header(self, size: int) -> tuple[int, int, int]:
        """(P, E, crc) of the directory header right before the trailer (version 3), their ranges checked."""
        if size < TRAILER_BYTES + PAGES_HEADER_BYTES:
            raise _corrupt(self.name, f"has {size} bytes, too few for its trailer and directory header")
        (header,) = self._read([(size - TRAILER_BYTES - PAGES_HEADER_BYTES, size - TRAILER_BYTES)])
        return _check_pages_header(self.name, _PAGES_HEADER.unpack(header))

    def _filter_header(self, end: int) -> tuple[int, int, int]:
        """(W, k, crc) of the filter header that ends ``end - TRAILER_BYTES`` (right before the trailer, or the
        directory), their ranges checked."""
        if end < TRAILER_BYTES + FILTER_HEADER_BYTES:
            raise _corrupt(self.name, f"has {self.size} bytes, too few for its trailer and filter header")
        (header,) = self._read([(end - TRAILER_BYTES - FILTER_HEADER_BYTES, end - TRAILER_BYTES)])
        words, k, crc, reserved = _FILTER_HEADER.unpack(header)
        if words < 1 or not 1 <= k <= MAX_K or reserved != 0:
            raise _corrupt(self.name, f"has a key filter header of {words} words, {k} bits per key and reserved "
                                      f"{reserved:#x}, which no writer made")
        return words, k, crc

    def _filter(self, start: int, words: int, k: int, crc: int) -> KeyFilter:
        """The key filter, its CRC checked, and checked to hold the hashes the index names (see the module
        docstring): a damaged filter is never trusted to say a key is absent."""
        (data,) = self._read([(start, start + 8 * words)])
        if zlib.crc32(data) != crc:
            raise _corrupt(self.name, "has a key filter whose CRC-32 does not match its header")
        key_filter = KeyFilter(np.frombuffer(bytes(data), dtype="<u8"), k)
        named = np.concatenate([self.index["first"], self.index["last"]]) & np.uint64(0xFFFFFFFF)
        if not key_filter.might_contain(named).all():
            raise _corrupt(self.name, "has a key filter that denies a hash its block index names")
        return key_filter

    def might_contain(self, hashes):
        """Whether a key of each hash (int32, as Spark's) may be in the file: the filter's answer, True for
        every hash without one. Vectorised; a scalar for a scalar."""
        if self.filter is not None:
            return self.filter.might_contain(hashes)
        return True if np.ndim(hashes) == 0 else np.ones(np.shape(hashes), dtype=bool)

    def _read(self, ranges):
        chunks = self._fetch(ranges)
        for (a, b), chunk in zip(ranges, chunks):
            if len(chunk) != b - a:
                raise _corrupt(self.name, f"is truncated: bytes {a}..{b} gave {len(chunk)}")
        return chunks

    def _check_index(self, index_offset: int) -> None:
        ix = self.index
        ends = ix["offset"] + ix["stored"]
        starts_ok = len(ix) == 0 or (ix["offset"][0] == 0 and np.array_equal(ix["offset"][1:], ends[:-1]))
        if not starts_ok or (len(ix) and int(ends[-1]) != index_offset):
            raise _corrupt(self.name, "has blocks that do not tile the bytes before its index")
        if np.any(ix["first"] > ix["last"]) or np.any(ix["last"][:-1] > ix["first"][1:]):
            raise _corrupt(self.name, "has a block index out of sort-key order")
        if int(ix["records"].sum()) != self.rows or np.any(ix["records"] == 0):
            raise _corrupt(self.name, f"has block record counts that do not add up to its {self.rows} records")
        if self.codec == RAW and not np.array_equal(ix["stored"], ix["raw"]):
            raise _corrupt(self.name, "has raw blocks whose stored and raw lengths differ")

    @property
    def blocks(self) -> int:
        return len(self.index)

    def block(self, b: int) -> bytes:
        """Block ``b``'s raw bytes (its records), its CRC checked when verifying."""
        entry = self.index[b]
        start, stored, raw = int(entry["offset"]), int(entry["stored"]), int(entry["raw"])
        (data,) = self._read([(start, start + stored)])
        where = f"block {b} (bytes {start}..{start + stored})"
        if self.verify and zlib.crc32(data) != int(entry["crc"]):
            raise _corrupt(self.name, f"has {where} whose CRC-32 does not match its index")
        if self.codec == RAW:
            return bytes(data)
        try:
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw)
        except zstandard.ZstdError as err:
            raise _corrupt(self.name, f"has {where} that does not decompress ({err})") from None
        if len(out) != raw:
            raise _corrupt(self.name, f"has {where} of {len(out)} raw bytes, its index says {raw}")
        return out

    def records(self, b: int) -> list[Record]:
        """Block ``b``'s records, in order, their framing checked against the index."""
        raw, entry = self.block(b), self.index[b]
        out, at, previous = [], 0, int(entry["first"])
        while at < len(raw):
            if at + HEADER_BYTES > len(raw):
                raise self._bad_block(b, f"a record header cut at byte {at}")
            kg, h, klen, vlen = _HEADER.unpack_from(raw, at)
            end = at + HEADER_BYTES + klen + max(vlen, 0)
            if klen < 0 or klen % 8 or vlen < -1 or (vlen > 0 and vlen % 8) or end > len(raw):
                raise self._bad_block(b, f"a record at byte {at} with key length {klen}, value length {vlen}")
            s = sort_key(kg, h)
            if kg < 0 or s < previous or s > int(entry["last"]):
                raise self._bad_block(b, f"a record at byte {at} out of sort-key order")
            key = raw[at + HEADER_BYTES:at + HEADER_BYTES + klen]
            value = None if vlen < 0 else raw[at + HEADER_BYTES + klen:end]
            out.append(Record(kg, h, bytes(key), None if value is None else bytes(value)))
            at, previous = end, s
        if len(out) != int(entry["records"]) or (out and sort_key(out[0].kg, out[0].hash) != int(entry["first"])) \
                or (out and previous != int(entry["last"])):
            raise self._bad_block(b, f"{len(out)} records that do not match its index entry")
        return out

    def _bad_block(self, b: int, what: str) -> ChecksumMismatch:
        return _corrupt(self.name, f"has block {b} with {what}")

    def __iter__(self) -> Iterator[Record]:
        for b in range(self.blocks):
            yield from self.records(b)

    def lookup(self, kg: int, h: int, key: bytes):
        """The value bytes of a key, ``DELETED`` for a tombstone, None when the file does not hold it."""
        if not self.might_contain(h):
            return None
        s = sort_key(kg, h)
        key = bytes(key)
        b = int(np.searchsorted(self.index["last"], np.uint64(s), side="left"))
        while b < self.blocks and int(self.index["first"][b]) <= s:
            for record in self.records(b):
                rs = sort_key(record.kg, record.hash)
                if rs > s:
                    return None
                if rs == s and record.key == key:
                    return DELETED if record.value is None else record.value
            b += 1
        return None

    def to_table(self) -> pa.Table:
        """Every record as opaque rows (kg, hash, key, value: UnsafeRow bytes; null value = tombstone)."""
        records = list(self)
        return pa.table({
            "kg": pa.array([r.kg for r in records], pa.int32()),
            "hash": pa.array([r.hash for r in records], pa.int32()),
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
        }, schema=tables.CHANGES_SCHEMA)


def lookup(source, kg: int, h: int, key: bytes, *, name: str = "row image", size: int | None = None,
           verify: bool = True):
    """``RowImage(source, name, size=size).lookup(kg, h, key)`` for a one-off lookup."""
    return RowImage(source, name, size=size, verify=verify).lookup(kg, h, key)


#: A remote image's page directory is fetched with its trailer in one round trip from a guess of its size: at
#: most one block per this many bytes of the file (a stored 4 KiB block below 512 bytes is rare; smaller ones
#: cost a second round trip, never a wrong answer).
MIN_STORED_BLOCK_GUESS = 512


@dataclass(frozen=True)
class Tail:
    """What a reader needs of an image before its first lookup, by byte range: the file's last bytes (filter
    header, page directory and its header, trailer), and of an image older than version 3 its whole block
    index before them. Not the blocks, not the index pages, not the filter's words."""

    ranges: tuple[tuple[int, int], ...]   # [start, end) in the file: (before version 3, the index, then) the end
    data: tuple[bytes, ...]
    blocks: int
    filter_words: int

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.data)


#: Largest range of a tail's index read: the pieces of a large index are read at once (``read_tail``).
TAIL_RANGE_BYTES = 1 << 20


def read_tail(fetch: Callable[[list[tuple[int, int]]], list], name: str, size: int, rows: int,
              known: bytes = b"") -> Tail:
    """The tail of an image of ``size`` bytes and ``rows`` records (its manifest entry says both) read by byte
    ranges through ``fetch`` (``CheckpointStorage.read_ranges``): of a version-3 image, its last bytes (filter
    header, page directory, directory header, trailer) in one round trip when the guess of the directory's size
    holds (see MIN_STORED_BLOCK_GUESS), a few KiB at any size; of an older one, the trailer, then the whole
    index. ``known``: the file's last bytes as its manifest entry holds them (``WrittenImage.tail``): then
    nothing is fetched when they are the whole tail. Trailer, sizes and the directory's (or the index's) CRC are
    checked as ``RowImage`` checks them (ChecksumMismatch, FormatVersionError)."""
    if size < TRAILER_BYTES:
        raise _corrupt(name, f"has {size} bytes, fewer than its {TRAILER_BYTES}-byte trailer")
    if TRAILER_BYTES <= len(known) <= size:
        end = known
    else:
        blocks_guess = max(1, min(rows, -(-size // MIN_STORED_BLOCK_GUESS)))
        guess = min(size, TRAILER_BYTES + PAGES_HEADER_BYTES + FILTER_HEADER_BYTES
                    + PAGE_ENTRY.itemsize * -(-blocks_guess // PAGE_ENTRIES))
        (end,) = _checked(fetch, [(size - guess, size)], name)
    index_offset, _rows, blocks, index_crc, codec, flags, magic, version = _TRAILER.unpack(end[-TRAILER_BYTES:])
    if magic != MAGIC:
        raise _corrupt(name, "does not end with the row image magic")
    if version > VERSION:
        raise FormatVersionError(f"row image {name} has format version {version}, newer than the {VERSION} "
                                 f"this spark_state reads; upgrade spark_state on the executors.")
    if version < 1 or codec not in (RAW, ZSTD) or flags & ~_FLAGS[version]:
        raise _corrupt(name, f"has format version {version}, codec {codec} and flags {flags:#x}, which no writer made")
    pages = per_page = 0
    directory_bytes = 0
    if flags & PAGED:
        if len(end) < TRAILER_BYTES + PAGES_HEADER_BYTES:
            raise _corrupt(name, f"has {size} bytes, too few for its trailer and directory header")
        pages, per_page, pages_crc = _check_pages_header(
            name, _PAGES_HEADER.unpack(end[-TRAILER_BYTES - PAGES_HEADER_BYTES:-TRAILER_BYTES]))
        directory_bytes = PAGE_ENTRY.itemsize * pages + PAGES_HEADER_BYTES
    head = TRAILER_BYTES + directory_bytes + (FILTER_HEADER_BYTES if flags & FILTER else 0)
    if head > size:
        raise _corrupt(name, f"has {size} bytes, too few for its trailer and a directory of {pages} pages")
    if head > len(end):   # the guess missed: one more round trip for exactly the tail
        (end,) = _checked(fetch, [(size - head, size)], name)
    end = bytes(end[-head:])
    words = _FILTER_HEADER.unpack(end[:FILTER_HEADER_BYTES])[0] if flags & FILTER else 0
    index_end = index_offset + INDEX_ENTRY.itemsize * blocks
    if words < 0 or index_end + (8 * words + FILTER_HEADER_BYTES if flags & FILTER else 0) + directory_bytes \
            + TRAILER_BYTES != size or (flags & PAGED and pages != -(-blocks // per_page)):
        raise _corrupt(name, f"has {size} bytes, but its trailer puts {blocks} index entries at byte {index_offset}")
    if flags & PAGED:
        directory = end[head - TRAILER_BYTES - directory_bytes:head - TRAILER_BYTES - PAGES_HEADER_BYTES]
        if _directory_crc(directory, pages, per_page) != pages_crc:
            raise _corrupt(name, "has a page directory whose CRC-32 does not match its header")
        return Tail(ranges=((size - head, size),), data=(end,), blocks=blocks, filter_words=words)
    # an image written before version 3: its whole index, in pieces of TAIL_RANGE_BYTES read at once
    index = b"".join(_checked(fetch, _pieces(index_offset, index_end), name)) if blocks else b""
    if zlib.crc32(index) != index_crc:
        raise _corrupt(name, "has a block index whose CRC-32 does not match its trailer")
    return Tail(ranges=((index_offset, index_end), (size - head, size)), data=(index, end),
                blocks=blocks, filter_words=words)


def _pieces(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) as ranges of at most TAIL_RANGE_BYTES (none when empty)."""
    return [(a, min(a + TAIL_RANGE_BYTES, end)) for a in range(start, end, TAIL_RANGE_BYTES)]


def _checked(fetch, ranges, name: str) -> list:
    chunks = fetch(ranges)
    for (a, b), chunk in zip(ranges, chunks):
        if len(chunk) != b - a:
            raise _corrupt(name, f"is truncated: bytes {a}..{b} gave {len(chunk)}")
    return chunks
