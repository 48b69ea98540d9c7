"""Spark's ``UnsafeRow`` bytes from typed Arrow rows, vectorised with numpy (and back, for tests and readers).

(Over 400 lines on purpose: the numbered layout rules below and the writer and reader that follow them
stay in one module, so a change to the bytes is made, and reviewed, in one place.)

A row image (``spark_state.format.rowimage``) holds each key as exactly the bytes Spark's
``UnsafeProjection`` makes for it: the JVM looks keys up by comparing bytes, so one differing padding byte
is a missed key. The typed state tables hold keys and values as Arrow struct columns (Spark's
``ArrowWriter`` conversion); this module turns such a struct array back into those bytes without a
Python loop per row (loops run per field and per nesting level).

The layout, as Spark 4.0-4.3 writes it (``UnsafeRowWriter``, ``UnsafeWriter``, the code
``GenerateUnsafeProjection`` generates and ``InterpretedUnsafeProjection``), for a struct of k fields::

    null bitset   ceil(k/64) little-endian 8-byte words; bit i set = field i is null
    k slots       8 bytes each, in field order
    variable      each variable-length field's bytes, in field order, zero-padded to a multiple of 8

1. A null field has its bit set and an all-zero slot (``setNullAt`` writes ``0L``), except a decimal of
   precision > 18 (below).
2. boolean, byte, short, int and float sit in the low bytes of their zeroed slot (``write(int, x)``
   zeroes the long first); date is the int of days; long, double, timestamp (UTC micros, any zone),
   timestamp_ntz, day-time interval (duration[us] micros) and time (time64[ns] nanos) fill the slot.
3. float and double are stored as their raw bits: Spark 4's ``writeFloat``/``writeDouble`` call
   ``Platform.putFloat``/``putDouble`` and no longer canonicalise NaN (Spark 2.x's did); -0.0 stays -0.0.
4. decimal, precision <= 18: the unscaled value as a long in the slot.
5. decimal, precision > 18: a zeroed 16-byte region in the variable part holding
   ``BigInteger.toByteArray()`` of the unscaled value (big-endian, minimal two's complement, 1-16 bytes);
   the slot is (offset << 32) | byte count. A null one keeps its region and offset, bit set, count 0.
6. string and binary: the bytes (any bytes: Spark strings need not be valid UTF-8), zero-padded to 8;
   the slot is (offset from the row's own start << 32) | byte count. An empty value has no bytes and
   its slot still holds the offset where it would start.
7. a nested struct is a nested UnsafeRow written where the variable part has got to, its slot
   (offset << 32) | its size; offsets inside it count from its own start. A struct of no fields is 0
   bytes (a top-level one too: a global aggregation's key).
8. Arrow's null type (Spark's NullType) is always null: bit set, slot zero.

Every row's size is a multiple of 8 and every byte not written above is zero. Lists, maps, calendar
intervals, unsigned integers and other units are not supported (``supports`` says why): a store with
such a type gets no row image. Dictionary-encoded strings (as files store them) are decoded first.
Opaque (format 1) tables hold UnsafeRow bytes already and need none of this.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: Decimals up to this precision are an unscaled long in the slot (Spark's Decimal.MAX_LONG_DIGITS).
MAX_LONG_DIGITS = 18

_U32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)


class Support:
    """Whether an Arrow type can be written as UnsafeRows; false ones carry the reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str | None = None):
        self.reason = reason

    def __bool__(self) -> bool:
        return self.reason is None

    def __repr__(self) -> str:
        return "Support()" if self else f"Support({self.reason!r})"


def supports(arrow_type: pa.DataType) -> Support:
    """Whether rows of this Arrow struct type (a typed table's ``key`` or ``value``) have an UnsafeRow
    encoding here, and if not, which field and type stop it."""
    if not pa.types.is_struct(arrow_type):
        return Support(f"an UnsafeRow is a struct, got {arrow_type}")
    reason = _unsupported(arrow_type, "")
    return Support(reason)


def _unsupported(t: pa.DataType, path: str) -> str | None:
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            f = t.field(i)
            reason = _unsupported(f.type, f"{path}.{f.name}" if path else f.name)
            if reason:
                return reason
        return None
    if pa.types.is_dictionary(t):
        if _is_bytes(t.value_type) and pa.types.is_integer(t.index_type):
            return None
        return f"field {path}: {t} is not a dictionary of strings or binaries"
    if pa.types.is_decimal(t) and t.bit_width != 128:
        return f"field {path}: {t} is not Spark's decimal128"
    if (_fixed_dtype(t) is not None or pa.types.is_boolean(t) or _is_bytes(t) or pa.types.is_null(t)
            or pa.types.is_decimal(t)):
        return None
    return f"field {path}: {t} has no UnsafeRow encoding here (lists, maps, intervals and other units do not)"


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t))


def _fixed_dtype(t: pa.DataType):
    """The unsigned numpy dtype of a fixed-width Spark value's bits, or None."""
    if pa.types.is_int8(t):
        return np.uint8
    if pa.types.is_int16(t):
        return np.uint16
    if pa.types.is_int32(t) or pa.types.is_date32(t) or pa.types.is_float32(t):
        return np.uint32
    if pa.types.is_int64(t) or pa.types.is_float64(t):
        return np.uint64
    if (pa.types.is_timestamp(t) or pa.types.is_duration(t)) and t.unit == "us":
        return np.uint64
    if pa.types.is_time64(t) and t.unit == "ns":
        return np.uint64
    return None


# ------------------------------------------------------------------ numpy views of Arrow buffers

def _valid(arr: pa.Array) -> np.ndarray | None:
    """Validity per row as bools, or None when no row is null."""
    if pa.types.is_null(arr.type):
        return np.zeros(len(arr), dtype=bool)
    if arr.null_count == 0:
        return None
    bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, count=arr.offset + len(arr), bitorder="little")[arr.offset:].view(bool)


def _values(arr: pa.Array, dtype, per_row: int = 1) -> np.ndarray:
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr) * per_row, dtype=dtype)
    start = arr.offset * per_row
    return np.frombuffer(buf, dtype=dtype, count=start + len(arr) * per_row)[start:]


def _bits(arr: pa.Array) -> np.ndarray:
    if len(arr) == 0:
        return np.zeros(0, dtype=np.uint8)
    bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, count=arr.offset + len(arr), bitorder="little")[arr.offset:]


def _take(a, idx):
    return a if a is None or idx is None else a[idx]


def _n(column, idx) -> int:
    return column.length if idx is None else len(idx)


def _copy_segments(out8: np.ndarray, dest: np.ndarray, src8: np.ndarray, src_start: np.ndarray,
                   lens: np.ndarray) -> None:
    """out8[dest[i] : dest[i] + lens[i]] = src8[src_start[i] : ...] for every i, in one scatter of bytes."""
    total = int(lens.sum())
    if total == 0:
        return
    before = np.cumsum(lens) - lens
    pos = np.arange(total, dtype=np.int64)
    to = np.repeat(dest - before, lens)
    to += pos
    frm = np.repeat(src_start - before, lens)
    frm += pos
    out8[to] = src8[frm]


class _Words:
    """Variable-length values read 8 bytes at a time from any byte offset (a 1-byte-strided uint64 view of
    the values, padded so the last word can be read whole)."""

    def __init__(self, data: np.ndarray):
        padded = np.zeros(len(data) + 8, dtype=np.uint8)
        padded[:len(data)] = data
        self._keep = padded
        self.at = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))

    def copy(self, out64: np.ndarray, dest: np.ndarray, src_start: np.ndarray, lens: np.ndarray) -> None:
        """Writes each value i at byte ``dest[i]`` (a multiple of 8) of zeroed memory, zero-padded to a
        whole word: a scatter of words, 8x fewer than bytes."""
        count = (lens + 7) >> 3
        total = int(count.sum())
        if total == 0:
            return
        if count.min() == count.max():   # values of one word count (ids, codes): a 2-D gather, no repeats
            step = 8 * np.arange(count[0], dtype=np.int64)
            words = self.at[src_start[:, None] + step]
            tail = lens & 7
            cut = np.flatnonzero(tail)
            if len(cut):
                words[cut, -1] &= (np.uint64(1) << (8 * tail[cut]).astype(np.uint64)) - np.uint64(1)
            out64[(dest >> 3)[:, None] + step // 8] = words
            return
        first = np.cumsum(count) - count
        within = np.arange(total, dtype=np.int64) - np.repeat(first, count)
        words = self.at[np.repeat(src_start, count) + 8 * within]
        tail = lens & 7
        cut = np.flatnonzero(tail)   # values whose last word is partly beyond them: keep only their bytes
        if len(cut):
            last = first[cut] + count[cut] - 1
            words[last] &= (np.uint64(1) << (8 * tail[cut]).astype(np.uint64)) - np.uint64(1)
        out64[np.repeat(dest >> 3, count) + within] = words


# ------------------------------------------------------------------ columns: one Arrow array as numpy views
#
# Each column answers, for the rows ``idx`` (positions in its array; None = all of them):
#   valid(idx)      bools, or None when none is null
#   var_bytes(idx)  bytes each row adds to its row's variable part, or None for a slot-only field
#   slots(idx, out8, out64, starts, rel, extra)  the 8-byte slot words, after writing any variable bytes
#                   at starts + rel (starts: each row's byte offset in out8, rel: the field's offset in
#                   it, extra: what var_bytes(idx) returned)

class _Column:
    def __init__(self, arr: pa.Array):
        self.length = len(arr)
        self._valid = _valid(arr)

    def valid(self, idx):
        return _take(self._valid, idx)

    def var_bytes(self, idx):
        return None


class _Fixed(_Column):
    def __init__(self, arr: pa.Array, dtype):
        super().__init__(arr)
        self._bits = _values(arr, dtype)

    def slots(self, idx, out8, out64, starts, rel, extra):
        words = _take(self._bits, idx).astype(np.uint64)
        valid = self.valid(idx)
        if valid is not None:
            words[~valid] = 0
        return words


class _Bool(_Fixed):
    def __init__(self, arr: pa.Array):
        _Column.__init__(self, arr)
        self._bits = _bits(arr)


class _SmallDecimal(_Fixed):
    """Precision <= 18: the low 64 bits of Arrow's 128-bit unscaled value, checked to fit."""

    def __init__(self, arr: pa.Array):
        _Column.__init__(self, arr)
        pairs = _values(arr, np.int64, per_row=2).reshape(-1, 2)
        lo, hi = pairs[:, 0], pairs[:, 1]
        limit = 10 ** arr.type.precision
        bad = (hi != (lo >> 63)) | (lo >= limit) | (lo <= -limit)
        if self._valid is not None:
            bad &= self._valid
        if bad.any():
            raise ValueError(f"decimal value {arr[int(np.argmax(bad))]} does not fit {arr.type}")
        self._bits = lo.view(np.uint64)


class _Null(_Column):
    def slots(self, idx, out8, out64, starts, rel, extra):
        return np.zeros(_n(self, idx), dtype=np.uint64)


class _Bytes(_Column):
    """string / binary (and large_): bytes in the variable part, slot = offset << 32 | length."""

    def __init__(self, arr: pa.Array):
        super().__init__(arr)
        wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32,
                                count=arr.offset + len(arr) + 1)[arr.offset:] if len(arr) else np.zeros(1, np.int64)
        self._start = offsets[:-1].astype(np.int64)
        self._len = np.diff(offsets).astype(np.int64)
        if self._valid is not None:
            self._len[~self._valid] = 0
        data = arr.buffers()[2]
        self._data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        self._words = None

    def words(self) -> _Words:
        if self._words is None:
            self._words = _Words(self._data)
        return self._words

    def var_bytes(self, idx):
        return (_take(self._len, idx) + 7) & ~7

    def slots(self, idx, out8, out64, starts, rel, extra):
        lens = _take(self._len, idx)
        self.words().copy(out64, starts + rel, _take(self._start, idx), lens)
        words = (rel.astype(np.uint64) << _U32) | lens.astype(np.uint64)
        valid = self.valid(idx)
        if valid is not None:
            words[~valid] = 0
        return words


class _BigDecimal(_Column):
    """Precision > 18: ``BigInteger.toByteArray()`` of the unscaled value in a 16-byte region that every
    row has, null or not."""

    def __init__(self, arr: pa.Array):
        super().__init__(arr)
        self._le = _values(arr, np.uint8, per_row=16).reshape(-1, 16)   # little-endian two's complement

    def var_bytes(self, idx):
        return np.full(_n(self, idx), 16, dtype=np.int64)

    def slots(self, idx, out8, out64, starts, rel, extra):
        le = _take(self._le, idx)
        valid = self.valid(idx)
        count = _min_bytes(le)
        if valid is not None:
            count[~valid] = 0
        be = le[:, ::-1]   # big-endian; the value is its last `count` bytes
        col = np.arange(16)
        keep = col[None, :] >= (16 - count)[:, None]
        to = (starts + rel)[:, None] + (col[None, :] - (16 - count)[:, None])
        out8[to[keep]] = be[keep]
        return (rel.astype(np.uint64) << _U32) | count.astype(np.uint64)


_BIT_LENGTH = np.array([int(b).bit_length() for b in range(256)], dtype=np.int64)


def _min_bytes(le: np.ndarray) -> np.ndarray:
    """Bytes of BigInteger.toByteArray() for 16-byte little-endian two's complement values:
    bitLength // 8 + 1, where bitLength counts the bits of the value (of ~value if negative)."""
    negative = (le[:, 15] & 0x80) != 0
    mag = np.where(negative[:, None], ~le, le)
    nonzero = mag != 0
    top = np.where(nonzero.any(axis=1), 15 - np.argmax(nonzero[:, ::-1], axis=1), 0)
    bit_length = 8 * top + _BIT_LENGTH[mag[np.arange(len(mag)), top]]
    return bit_length // 8 + 1


class _Struct(_Column):
    """A struct column: as a field, a nested UnsafeRow in its parent's variable part; as the top level,
    the rows themselves (``row_sizes``, ``write_rows``)."""

    def __init__(self, arr: pa.Array):
        super().__init__(arr)
        self.fields = [_column(child) for child in arr.flatten()]
        self.words = (len(self.fields) + 63) // 64
        self.fixed = 8 * (self.words + len(self.fields))

    def row_sizes(self, idx) -> np.ndarray:
        sizes = np.full(_n(self, idx), self.fixed, dtype=np.int64)
        for field in self.fields:
            extra = field.var_bytes(idx)
            if extra is not None:
                sizes += extra
        return sizes

    def write_rows(self, idx, out8: np.ndarray, out64: np.ndarray, starts: np.ndarray) -> None:
        """Writes the rows ``idx`` (none of them null) at byte offsets ``starts`` (multiples of 8) of
        zeroed memory; out64 is out8 viewed as uint64."""
        n = _n(self, idx)
        if n == 0 or not self.fields:
            return
        base = starts >> 3
        rel = np.full(n, self.fixed, dtype=np.int64)
        nulls = [None] * self.words
        for j, field in enumerate(self.fields):
            extra = field.var_bytes(idx)
            out64[base + (self.words + j)] = field.slots(idx, out8, out64, starts, rel, extra)
            if extra is not None:
                rel += extra
            valid = field.valid(idx)
            if valid is not None:
                bit = (~valid).astype(np.uint64) << np.uint64(j % 64)
                w = j // 64
                nulls[w] = bit if nulls[w] is None else nulls[w] | bit
        for w, word in enumerate(nulls):
            if word is not None:
                out64[base + w] = word

    def _present(self, idx):
        """The rows of ``idx`` that are not null, and the mask that picked them (None: all)."""
        valid = self.valid(idx)
        if valid is None:
            return idx, None
        return (np.flatnonzero(valid) if idx is None else idx[valid]), valid

    def var_bytes(self, idx):
        rows, valid = self._present(idx)
        sizes = self.row_sizes(rows)
        if valid is None:
            return sizes
        out = np.zeros(len(valid), dtype=np.int64)
        out[valid] = sizes
        return out

    def slots(self, idx, out8, out64, starts, rel, extra):
        rows, valid = self._present(idx)
        at = starts + rel
        self.write_rows(rows, out8, out64, at if valid is None else at[valid])
        words = (rel.astype(np.uint64) << _U32) | extra.astype(np.uint64)
        if valid is not None:
            words[~valid] = 0
        return words


def _column(arr: pa.Array) -> _Column:
    t = arr.type
    if pa.types.is_dictionary(t):
        return _column(arr.dictionary_decode())
    if pa.types.is_struct(t):
        return _Struct(arr)
    if pa.types.is_boolean(t):
        return _Bool(arr)
    if pa.types.is_decimal(t):
        return _SmallDecimal(arr) if t.precision <= MAX_LONG_DIGITS else _BigDecimal(arr)
    if _is_bytes(t):
        return _Bytes(arr)
    if pa.types.is_null(t):
        return _Null(arr)
    dtype = _fixed_dtype(t)
    if dtype is None:
        raise TypeError(f"no UnsafeRow encoding for {t}")
    return _Fixed(arr, dtype)


# ------------------------------------------------------------------ public API

def _one_array(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


class Rows:
    """A struct array's rows, ready to be written as UnsafeRows: numpy views of its buffers, built once,
    so that many slices of rows (``idx``) can be sized and written without touching Arrow again."""

    def __init__(self, array: pa.Array | pa.ChunkedArray):
        support = supports(array.type)
        if not support:
            raise TypeError(f"cannot write {array.type} as UnsafeRows: {support.reason}")
        array = _one_array(array)
        self.type = array.type
        self._root = _Struct(array)

    def __len__(self) -> int:
        return self._root.length

    def valid(self) -> np.ndarray | None:
        """Which rows are not null (None: all); a null row (a typed table's deleted value) has no bytes."""
        return self._root.valid(None)

    def sizes(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Bytes of the UnsafeRow of each row of ``idx`` (all rows if None), as int64."""
        return self._root.row_sizes(idx)

    def write(self, out: np.ndarray, starts: np.ndarray, idx: np.ndarray | None = None) -> None:
        """Writes the UnsafeRows of rows ``idx`` (none null) into ``out`` (zeroed uint8 whose length is a
        multiple of 8) at byte offsets ``starts`` (multiples of 8, each row getting ``sizes`` bytes)."""
        self._root.write_rows(idx, out, out.view(np.uint64), np.asarray(starts, dtype=np.int64))


class Opaque:
    """UnsafeRows that are bytes already (a format-1 table's binary ``key``/``value`` column), with
    ``Rows``' interface: sized and copied as they are."""

    def __init__(self, array: pa.Array | pa.ChunkedArray):
        array = _one_array(array)
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise TypeError(f"opaque UnsafeRows are a binary column, got {array.type}")
        self._bytes = _Bytes(array)

    def __len__(self) -> int:
        return self._bytes.length

    def valid(self) -> np.ndarray | None:
        return self._bytes.valid(None)

    def sizes(self, idx: np.ndarray | None = None) -> np.ndarray:
        sizes = _take(self._bytes._len, idx)
        bad = np.flatnonzero(sizes % 8)
        if len(bad):
            row = int(bad[0] if idx is None else idx[bad[0]])
            raise ValueError(f"row {row} holds {int(sizes[bad[0]])} bytes, not an UnsafeRow (a multiple of 8)")
        return sizes

    def write(self, out: np.ndarray, starts: np.ndarray, idx: np.ndarray | None = None) -> None:
        b = self._bytes
        b.words().copy(out.view(np.uint64), np.asarray(starts, dtype=np.int64), _take(b._start, idx),
                       _take(b._len, idx))


def rows(array: pa.Array | pa.ChunkedArray) -> Rows | Opaque:
    """The writer of a typed (struct) or opaque (binary) key or value column."""
    return Rows(array) if pa.types.is_struct(array.type) else Opaque(array)


def encode(array: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The UnsafeRow bytes of each row of a struct array: ``(offsets, data)``, row i being
    ``data[offsets[i]:offsets[i + 1]]``. A null row gets no bytes (tell it from a zero-field row by the
    array's validity)."""
    rows = Rows(array)
    valid = rows.valid()
    idx = None if valid is None else np.flatnonzero(valid)
    sizes = rows.sizes(idx)
    if valid is not None:
        full = np.zeros(len(rows), dtype=np.int64)
        full[valid] = sizes
        sizes = full
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.zeros(int(offsets[-1]), dtype=np.uint8)
    rows.write(data, offsets[:-1] if valid is None else offsets[:-1][valid], idx)
    return offsets, data


# ------------------------------------------------------------------ decoding (tests and readers)

def decode(offsets, data, arrow_type: pa.DataType, valid: np.ndarray | None = None) -> pa.StructArray:
    """Arrow rows of ``arrow_type`` from UnsafeRow bytes (``encode``'s output; ``valid`` marks the rows
    that are not null). Plain strings and binaries come back for dictionary fields."""
    support = supports(arrow_type)
    if not support:
        raise TypeError(f"cannot read {arrow_type} from UnsafeRows: {support.reason}")
    offsets = np.asarray(offsets, dtype=np.int64)
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if len(raw) % 8:
        raw = np.concatenate([raw, np.zeros(8 - len(raw) % 8, np.uint8)])
    if len(raw) == 0:
        raw = np.zeros(8, np.uint8)
    starts = offsets[:-1]
    if np.any(starts % 8):
        raise ValueError("UnsafeRows start at multiples of 8 bytes")
    rows = _decode_struct(arrow_type, raw, raw.view(np.uint64), starts if valid is None else starts[valid])
    return rows if valid is None else _expand(rows, np.asarray(valid, dtype=bool))


def _expand(present: pa.Array, valid: np.ndarray) -> pa.Array:
    """The rows of `present` spread over len(valid) rows, null where valid is false."""
    pos = np.cumsum(valid) - 1
    return present.take(pa.array(np.where(valid, pos, 0), mask=~valid))


def _validity_buffer(null: np.ndarray) -> pa.Buffer | None:
    return pa.py_buffer(np.packbits(~null, bitorder="little")) if null.any() else None


def _decode_struct(t: pa.StructType, raw8: np.ndarray, raw64: np.ndarray, starts: np.ndarray) -> pa.StructArray:
    k = t.num_fields
    words = (k + 63) // 64
    base = starts >> 3
    children = []
    for j in range(k):
        f = t.field(j)
        null = ((raw64[base + j // 64] >> np.uint64(j % 64)) & np.uint64(1)).astype(bool) if len(starts) \
            else np.zeros(0, dtype=bool)
        slot = raw64[base + words + j] if len(starts) else np.zeros(0, np.uint64)
        children.append(_decode_field(f.type, raw8, raw64, starts, slot, null))
    if k == 0:
        return pa.Array.from_buffers(t, len(starts), [None], children=[])
    fields = [pa.field(t.field(j).name, c.type, t.field(j).nullable, t.field(j).metadata)
              for j, c in enumerate(children)]
    return pa.StructArray.from_arrays(children, fields=fields)


def _decode_field(t, raw8, raw64, starts, slot, null) -> pa.Array:
    n = len(starts)
    validity = _validity_buffer(null)
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return pa.nulls(n)
    if pa.types.is_struct(t):
        present = np.flatnonzero(~null)
        nested = _decode_struct(t, raw8, raw64, (starts + (slot >> _U32).astype(np.int64))[present])
        return _expand(nested, ~null) if null.any() else nested
    if pa.types.is_boolean(t):
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(np.packbits(slot & np.uint64(1) != 0,
                                                                              bitorder="little"))])
    if pa.types.is_decimal(t):
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(_decimal_words(t, raw8, starts, slot))])
    if _is_bytes(t):
        lens = (slot & _LOW32).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = np.zeros(int(offsets[-1]), dtype=np.uint8)
        _copy_segments(data, offsets[:-1], raw8, starts + (slot >> _U32).astype(np.int64), lens)
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(offsets if wide else offsets.astype(np.int32)),
                                            pa.py_buffer(data)])
    dtype = _fixed_dtype(t)
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(slot.astype(dtype))])


def _decimal_words(t, raw8, starts, slot) -> np.ndarray:
    """Arrow's 16-byte little-endian unscaled values from the slots (and variable parts) of decimals."""
    out = np.zeros((len(starts), 2), dtype=np.int64)
    if t.precision <= MAX_LONG_DIGITS:
        out[:, 0] = slot.view(np.int64)
        out[:, 1] = out[:, 0] >> 63
        return out
    count = (slot & _LOW32).astype(np.int64)
    at = starts + (slot >> _U32).astype(np.int64)
    col = np.arange(16)
    be = raw8[at[:, None] + col[None, :]]      # the region's 16 bytes; the value is its first `count`
    negative = (be[:, 0] & 0x80) != 0
    shifted = np.where(negative[:, None], np.uint8(0xFF), np.uint8(0)).repeat(16, axis=1)
    src = col[None, :] - (16 - count)[:, None]   # right-align the `count` bytes, sign-extend the rest
    keep = src >= 0
    shifted[keep] = be[np.nonzero(keep)[0], src[keep]]
    shifted[count == 0] = 0
    return np.ascontiguousarray(shifted[:, ::-1]).view(np.int64).reshape(-1, 2)
