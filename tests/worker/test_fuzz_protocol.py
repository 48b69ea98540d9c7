"""Fuzzed frames from an authenticated peer: damaged framing, headers whose fields have any JSON value, and
damaged Arrow bodies get a named error (ProtocolError or another spark_state error) in reply, never an
internal error, a crash or an allocation of what a damaged length announces; and the worker keeps serving
every other store."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_state.chain import forget_stores
from spark_state.errors import ProtocolError, SparkStateError
from spark_state.worker.protocol import ipc_to_table, read_frame, table_to_ipc, write_frame
from spark_state.worker.server import Dispatcher
from tests.support.changes import opaque_changes
from tests.support.fuzzing import bounded_memory, fuzz_settings, mutations
from tests.support.worker_client import Worker

ROWS = opaque_changes({b"a": b"1", b"bb": b"2", b"ccc": None})
BODY = table_to_ipc(ROWS).to_pybytes()


def _frame(header: dict, body: bytes = b"") -> bytes:
    sink = io.BytesIO()
    write_frame(sink, header, body)
    return sink.getvalue()


FRAME = _frame({"op": "commit", "version": 1, "store": {"sparkRoot": "file:/x/state", "location": "file:/x/state/0/0",
                                                         "operator": 0, "partition": 0}}, BODY)


@fuzz_settings(300)
@given(mutations)
def test_damaged_frames_read_as_a_frame_or_fail_with_a_named_error(mutation):
    data = mutation.apply(FRAME)
    with bounded_memory(len(data)):
        try:
            read_frame(io.BufferedReader(io.BytesIO(data)))
        except (ProtocolError, EOFError):   # EOFError: the peer hung up inside a frame
            pass


def test_a_huge_announced_body_costs_only_the_bytes_that_arrive():
    """Regression: the body was read with one read(body_len): a damaged length of 2**40 asked Python to
    allocate a terabyte before a byte arrived."""
    data = FRAME[:FRAME.index(BODY) - 8] + struct.pack(">Q", 2**40) + BODY
    with bounded_memory(len(data)), pytest.raises(EOFError):
        read_frame(io.BufferedReader(io.BytesIO(data)))   # as a socket file reads


@fuzz_settings(200)
@given(mutations)
def test_damaged_arrow_bodies_are_protocol_errors_or_valid_rows(mutation):
    """Regression: a body whose offsets point outside its buffers decoded without complaint (and would
    crash the worker in the commit's first kernel); other Arrow errors escaped as internal errors."""
    data = mutation.apply(BODY)
    with bounded_memory(len(data)):
        try:
            ipc_to_table(data).validate(full=True)
        except ProtocolError:
            pass


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                   max_size=3), max_leaves=8)
_ops = st.sampled_from(["commit", "load", "latest", "abort", "maintenance", "validate", "hello", "nope", 7, None])


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory):
    d = Dispatcher("secret", cache_dir=str(tmp_path_factory.mktemp("images")))
    yield d
    d.close()
    forget_stores()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ckpt") / "state"
    return {"sparkRoot": f"file:{root}", "location": f"file:{root}/0/0", "operator": 0, "partition": 0}


@fuzz_settings(300)
@given(op=_ops, fields=st.dictionaries(st.sampled_from(
    ["version", "baseCommitId", "commitId", "minVersionsToRetain", "full", "repeatedKeys", "images", "options",
     "store"]), _json, max_size=4), store_fields=st.dictionaries(st.sampled_from(
    ["sparkRoot", "operator", "partition", "name", "queryId", "location"]), _json, max_size=2),
    body=st.sampled_from([b"", BODY, BODY[:40], b"\xff" * 9]))
def test_requests_with_fields_of_any_json_value_get_a_named_error(dispatcher, store, op, fields, store_fields,
                                                                   body):
    """Regression: a version or partition of 1e400 (JSON's infinity) raised OverflowError, which the worker
    reported as an internal error."""
    header = {"op": op, "store": {**store, **store_fields}, **fields}
    if isinstance(header.get("options"), dict):
        header["options"] = {}   # options are checked by tests/unit/test_options.py; keep the storage on disk
    try:
        dispatcher.handle(header, body)
    except SparkStateError:
        pass


def _store_of(tmp_path: Path, partition: int) -> dict:
    root = tmp_path / "ckpt" / "state"
    return {"sparkRoot": f"file:{root}", "location": f"file:{root}/0/{partition}", "operator": 0,
            "partition": partition, "name": "default"}


def test_a_peer_sending_garbage_does_not_disturb_other_stores(tmp_path):
    """Damaged frames on one connection: that connection gets a ProtocolError (or is closed), the worker
    stays up, and a store on another connection commits and loads exactly as before."""
    worker = Worker(tmp_path)
    try:
        good = worker.connect()
        base = {"store": _store_of(tmp_path, 0), "options": {"storage": "filesystem"}}
        assert good.request({"op": "commit", "version": 1, **base}, BODY)[0]["ok"]
        rogue_frames = [
            _frame({"op": "commit", "version": 1e400, "store": _store_of(tmp_path, 1)}, BODY),
            _frame({"op": "commit", "version": 1, "store": _store_of(tmp_path, 1)}, BODY[:-20] + b"\x00" * 20),
            b"\x00\x00\x00\x05[[[[[" + b"\x00" * 8,
            struct.pack(">I", 2**31) + b"{}",
        ]
        for frame in rogue_frames:
            rogue = worker.connect()
            rogue.sock.sendall(frame)
            rogue.sock.shutdown(1)   # nothing more comes: a frame that waits for more bytes ends here
            reply = rogue.stream.read()
            if reply:
                header, _ = read_frame(io.BytesIO(reply))
                assert not header["ok"] and header["kind"] != "InternalError", header
            rogue.close()
        assert worker.alive()
        assert good.request({"op": "commit", "version": 2, **base}, table_to_ipc(
            opaque_changes({b"dddd": b"4"})).to_pybytes())[0]["ok"]
        header, body = good.request({"op": "load", "version": 2, **base})
        loaded = ipc_to_table(body)
        assert dict(zip(loaded["key"].to_pylist(), loaded["value"].to_pylist())) == {
            b"a": b"1", b"bb": b"2", b"dddd": b"4"}
        good.close()
    finally:
        worker.close()
