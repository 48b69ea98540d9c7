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


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError(f"connection closed after {0 if not data else len(data)} of {n} bytes")
    return data


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
    except ValueError as err:
        raise ProtocolError(f"frame header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise ProtocolError("frame header must be a JSON object")
    (body_len,) = _U64.unpack(_read_exact(stream, _U64.size))
    if max_body is not None and body_len > max_body:
        raise ProtocolError(f"frame body of {body_len} bytes is larger than {max_body} allowed here")
    body = _read_exact(stream, body_len) if body_len else b""
    return header, body


def write_frame(stream: BinaryIO, header: dict, body: bytes | memoryview | pa.Buffer = b"") -> None:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    stream.write(_U32.pack(len(encoded)))
    stream.write(encoded)
    stream.write(_U64.pack(len(body)))
    if len(body):
        stream.write(body)
    stream.flush()


def table_to_ipc(table: pa.Table) -> pa.Buffer:
    """One Arrow IPC stream of ``table``: opaque rows as CHANGES_SCHEMA batches, typed rows as they are
    (no compression: the peer is on the same host)."""
    from spark_state.snapshot import CHANGES_SCHEMA, binary_batches, is_typed

    if table.schema != CHANGES_SCHEMA and table.schema.names == CHANGES_SCHEMA.names and not is_typed(table):
        batches, schema = binary_batches(table), CHANGES_SCHEMA   # wide offsets: the JVM reads 32-bit ones
    else:
        batches, schema = table.to_batches(), table.schema
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def ipc_to_table(body: bytes) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except pa.ArrowInvalid as err:
        raise ProtocolError(f"request body is not an Arrow IPC stream: {err}") from None
