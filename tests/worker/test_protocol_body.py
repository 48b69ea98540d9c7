"""The load reply streamed batch by batch (protocol.IpcBody): the frame's announced length is exactly the
bytes written, and they are table_to_ipc's bytes, for any rows a load returns."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from spark_state.errors import ProtocolError
from spark_state.format import tables
from spark_state.worker.protocol import IpcBody, ipc_to_table, read_frame, table_to_ipc, write_frame
from tests.support.changes import changes_table

KEY = pa.struct([("user", pa.string()), ("n", pa.int64())])
VALUE = pa.struct([("total", pa.int64()), ("name", pa.string()), ("seen", pa.timestamp("us", "UTC")),
                   ("inner", pa.struct([("x", pa.float64()), ("tags", pa.list_(pa.int32()))]))])
SCHEMA = tables.typed_schema(KEY, VALUE)

keys = st.fixed_dictionaries({"user": st.none() | st.text(max_size=6), "n": st.integers(-2**63, 2**63 - 1)})
values = st.none() | st.fixed_dictionaries({
    "total": st.none() | st.integers(-2**63, 2**63 - 1), "name": st.none() | st.text(max_size=20),
    "seen": st.none() | st.integers(0, 2**50),
    "inner": st.none() | st.fixed_dictionaries({"x": st.floats(allow_nan=False),
                                                "tags": st.none() | st.lists(st.integers(-5, 5), max_size=3)})})


def _chunked(table: pa.Table, cuts: list[int]) -> pa.Table:
    """The same rows as several chunks, some empty, some slices: what a fold's filter and concat hand over."""
    bounds = sorted({0, table.num_rows, *(c % (table.num_rows + 1) for c in cuts)})
    pieces = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])] + [table.slice(0, 0)]
    return pa.concat_tables(pieces)


def _streamed(table: pa.Table) -> tuple[int, bytes]:
    body = IpcBody(table)
    sink = io.BytesIO()
    body.write_to(sink)
    return len(body), sink.getvalue()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(keys, values), max_size=30), st.lists(st.integers(0, 40), max_size=4))
def test_streamed_typed_rows_are_exactly_the_announced_bytes(rows, cuts):
    hashes = np.arange(len(rows), dtype=np.int32)
    table = pa.table({"kg": pa.array(hashes), "hash": pa.array(hashes),
                      "key": pa.array([k for k, _ in rows], KEY), "value": pa.array([v for _, v in rows], VALUE)},
                     schema=SCHEMA)
    table = _chunked(table, cuts)
    announced, data = _streamed(table)
    assert announced == len(data)
    assert data == table_to_ipc(table).to_pybytes()
    assert ipc_to_table(data).equals(table.combine_chunks())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=20), st.none() | st.binary(max_size=40)), max_size=30),
       st.booleans(), st.lists(st.integers(0, 40), max_size=3))
def test_streamed_opaque_rows_go_out_with_32_bit_offsets(rows, wide, cuts):
    table = changes_table([0] * len(rows), [k for k, _ in rows], [v for _, v in rows])
    if wide:
        table = tables.widen(table)
    table = _chunked(table, cuts)
    announced, data = _streamed(table)
    assert announced == len(data)
    assert data == table_to_ipc(table).to_pybytes()
    assert ipc_to_table(data).schema == tables.CHANGES_SCHEMA


def test_a_frame_with_a_streamed_body_reads_back_as_one_frame():
    table = changes_table([1, 2], [b"a", b"b"], [b"x", None])
    sink = io.BytesIO()
    write_frame(sink, {"ok": True, "rows": 2}, IpcBody(table))
    write_frame(sink, {"ok": True})
    sink.seek(0)
    header, body = read_frame(sink)
    assert header == {"ok": True, "rows": 2} and ipc_to_table(body).equals(table)
    assert read_frame(sink) == ({"ok": True}, b"")


def test_a_body_longer_than_announced_is_refused_not_sent():
    body = IpcBody(changes_table([1], [b"a"], [b"x"]))
    body._size -= 1
    with pytest.raises((ProtocolError, pa.ArrowException)):
        body.write_to(io.BytesIO())
