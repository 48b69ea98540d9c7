"""Frames between the JVM shim and the worker (docs/protocol.md).

frame := u32 header_len | UTF-8 JSON header | u64 body_len | body (Arrow IPC stream or empty)
"""

from __future__ import annotations

import json
import struct
from typing import BinaryIO

import pyarrow as pa

from spark_state.errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_HEADER = 16 * 1024 * 1024
#: Before a connection has authenticated, frames are this small and carry no body.
HELLO_MAX_HEADER = 64 * 1024

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


#: Bytes read at a time for a large frame: memory follows the bytes that arrive, not the length announced.
_READ_CHUNK = 1 << 20


def _read_exact(stream: BinaryIO, n: int) -> bytes | bytearray:
    if n <= _READ_CHUNK:
        data = stream.read(n)
        if data is None or len(data) != n:
            raise EOFError(f"connection closed after {0 if not data else len(data)} of {n} bytes")
        return data
    out = bytearray()
    while len(out) < n:   # a damaged or hostile length costs what the peer sends, never an allocation of n
        chunk = stream.read(min(_READ_CHUNK, n - len(out)))
        if not chunk:
            raise EOFError(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return out   # not bytes(out): a copy would hold a large body twice (bodies are read, never changed)


def read_frame(stream: BinaryIO, *, max_header: int = MAX_HEADER,
               max_body: int | None = None) -> tuple[dict, bytes] | None:
    """Reads one frame; None when the peer closed the connection between frames.

    ``max_body`` bounds the body (None: unbounded); an oversized frame is refused
    before its body is read, so an unauthenticated peer cannot make the worker allocate.
    """
    first = stream.read(_U32.size)
    if not first:
        return None
    if len(first) != _U32.size:
        raise EOFError("connection closed inside a frame header")
    (header_len,) = _U32.unpack(first)
    if header_len > max_header:
        raise ProtocolError(f"frame header of {header_len} bytes is larger than {max_header}")
    try:
        header = json.loads(_read_exact(stream, header_len))
    except (ValueError, RecursionError) as err:   # RecursionError: JSON nested too deep
        raise ProtocolError(f"frame header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise ProtocolError("frame header must be a JSON object")
    (body_len,) = _U64.unpack(_read_exact(stream, _U64.size))
    if max_body is not None and body_len > max_body:
        raise ProtocolError(f"frame body of {body_len} bytes is larger than {max_body} allowed here")
    body = _read_exact(stream, body_len) if body_len else b""
    return header, body


def write_frame(stream: BinaryIO, header: dict,
                body: "bytes | memoryview | pa.Buffer | IpcBody | Pieces" = b"") -> None:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    stream.write(_U32.pack(len(encoded)))
    stream.write(encoded)
    stream.write(_U64.pack(len(body)))
    if isinstance(body, (IpcBody, Pieces)):
        body.write_to(stream)
    elif len(body):
        stream.write(body)
    stream.flush()


def _wire_batches(table: pa.Table) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """What goes on the socket: opaque rows as CHANGES_SCHEMA batches, typed rows as they are."""
    from spark_state.format.tables import CHANGES_SCHEMA, binary_batches, is_typed

    if table.schema != CHANGES_SCHEMA and table.schema.names == CHANGES_SCHEMA.names and not is_typed(table):
        return CHANGES_SCHEMA, list(binary_batches(table))   # wide offsets: the JVM reads 32-bit ones
    return table.schema, table.to_batches()


def table_to_ipc(table: pa.Table) -> pa.Buffer:
    """One Arrow IPC stream of ``table`` in one buffer (see _wire_batches; no compression: the peer is on
    the same host)."""
    schema, batches = _wire_batches(table)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


#: Arrow IPC's end-of-stream marker (continuation token, zero length).
_EOS_SIZE = 8


class IpcBody:
    """The Arrow IPC stream of a table, serialised straight onto the socket batch by batch.

    The frame's length goes first, so it is computed without serialising
    (``get_record_batch_size`` runs Arrow's writer against a counting sink):
    the JVM decodes the first batches while later ones are being written, and
    no copy of the whole reply is built (a 1M-row restore: 61 MiB). The same
    bytes as ``table_to_ipc``.
    """

    def __init__(self, table: pa.Table):
        self.schema, self.batches = _wire_batches(table)
        self._size = (self.schema.serialize().size + sum(pa.ipc.get_record_batch_size(b) for b in self.batches)
                      + _EOS_SIZE)

    def __len__(self) -> int:
        return self._size

    def write_to(self, stream: BinaryIO) -> None:
        counted = _Bounded(stream, self._size)
        with pa.ipc.new_stream(counted, self.schema) as writer:
            for batch in self.batches:
                writer.write_batch(batch)
        if counted.written != self._size:   # the peer waits for exactly the announced bytes
            raise ProtocolError(f"reply body is {counted.written} bytes, its frame announced {self._size}")


class Pieces:
    """A reply body of byte strings one after the other, then optionally an Arrow stream (``IpcBody``): the
    bytes of the ranges a ``fetch`` asked for, or a ``load``'s image tail before its changes. Written as they
    are, never joined into one copy."""

    def __init__(self, parts, ipc: IpcBody | None = None):
        self.parts = [memoryview(p).cast("B") for p in parts]
        self.ipc = ipc
        self._size = sum(p.nbytes for p in self.parts) + (len(ipc) if ipc is not None else 0)

    def __len__(self) -> int:
        return self._size

    def write_to(self, stream: BinaryIO) -> None:
        for part in self.parts:
            stream.write(part)
        if self.ipc is not None:
            self.ipc.write_to(stream)


class _Bounded:
    """A write-only file over `stream` that refuses to exceed the frame's announced length."""

    closed = False

    def __init__(self, stream: BinaryIO, limit: int):
        self._stream, self._limit, self.written = stream, limit, 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if self.written + n > self._limit:
            raise ProtocolError(f"reply body exceeds the {self._limit} bytes its frame announced")
        self._stream.write(data)
        self.written += n
        return n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def writable(self) -> bool:
        return True


def ipc_to_table(body: bytes) -> pa.Table:
    """A request's rows, validated in full: Arrow's IPC reader trusts a batch's offsets, and rows pointing
    outside their buffers would crash the worker (and every store it serves) in the first kernel."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        table.validate(full=True)
        return table
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise ProtocolError(f"request body is not a valid Arrow IPC stream: {err}") from None
