"""Requests of a shim that reads remote row images by byte range (issue 38), through a real worker process on
the loopback S3 server: a lazy ``load`` with ``ranges`` names the image by its path in the store and sends its
tail before the changes; ``fetch`` answers the bytes of any ranges of it, exactly, and refuses what is not a
file of the store or not a range."""

from __future__ import annotations

import io
import uuid

import pyarrow as pa
import pytest

from spark_state.format import rowimage
from spark_state.worker.protocol import ipc_to_table, table_to_ipc
from tests.support import s3_server
from tests.support.changes import typed_changes
from tests.support.worker_client import Worker


@pytest.fixture
def worker(tmp_path):
    s3_server.start()   # the worker inherits the endpoint (tests/conftest.py put it in the environment)
    w = Worker(tmp_path)
    yield w
    w.close()


def changes(rows: list[tuple[int, int | None]]) -> pa.Table:
    return typed_changes([({"k": k}, None if v is None else {"n": v}) for k, v in rows],
                         pa.struct([("k", pa.int64())]), pa.struct([("n", pa.int64())]), hash_of=lambda key: key["k"] * 7)


@pytest.fixture
def compacted(worker, tmp_path):
    """A connection and a store on S3 whose version 2 is its compacted snapshot's image plus one delta."""
    bucket = f"ranges-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(bucket)
    root = tmp_path / "ckpt" / "state"
    base = {"store": {"sparkRoot": f"file:{root}", "location": f"file:{root}/0/0", "operator": 0, "partition": 0,
                      "name": "default", "queryId": "q-38"},
            "options": {"checkpointRoot": f"s3://{bucket}/state", "rowImages.minRows": "0", "snapshotInterval": "100",
                        "rowImages.rangeReads": "true"}}
    conn = worker.connect()
    resp, _ = conn.request({"op": "commit", "version": 1, **base}, table_to_ipc(changes([(k, k) for k in range(3000)])))
    assert resp["ok"], resp
    resp, _ = conn.request({"op": "drain", "timeoutMs": 60_000})   # the first snapshot's image
    assert resp == {"ok": True, "pending": 0}, resp
    resp, _ = conn.request({"op": "commit", "version": 2, **base}, table_to_ipc(changes([(0, None), (1, 100)])))
    assert resp["ok"], resp
    return conn, base, bucket


def test_a_lazy_load_with_ranges_names_the_image_and_sends_its_tail_before_the_changes(compacted):
    conn, base, bucket = compacted
    resp, body = conn.request({"op": "load", "version": 2, "images": True, "ranges": True, **base})
    assert resp["ok"] and resp["rows"] == 2, resp
    image = resp["image"]
    assert "path" not in image and image["file"].startswith("shared/") and image["file"].endswith(".img")
    assert image["id"].endswith("/" + image["file"]) and image["id"].startswith(f"s3://{bucket}/state/")
    assert image["rows"] == 3000 and image["checksum"].startswith("crc32:")
    ((end_start, end),) = image["tail"]   # the file's last bytes: filter header, page directory, trailer
    assert end == image["size"] and end - end_start < 1024
    tail_bytes = end - end_start
    rows = ipc_to_table(body[tail_bytes:])
    assert sorted(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist()),
                  key=lambda r: r[0]["k"]) == [({"k": 0}, None), ({"k": 1}, {"n": 100})]
    # every byte of the image by range, ranges in any order and overlapping, is the file
    whole = image["size"]
    ranges = [[end_start, whole], [0, 7], [5, end_start]]
    resp, data = conn.request({"op": "fetch", "file": image["file"], "ranges": ranges, **base})
    assert resp["ok"] and resp["lengths"] == [whole - end_start, 7, end_start - 5], resp
    stream = io.BytesIO(data)
    parts = [stream.read(n) for n in resp["lengths"]]
    file = parts[1][:5] + parts[2] + parts[0]
    assert body[:tail_bytes] == file[end_start:end]
    assert len(rowimage.RowImage(file, image["file"]).to_table()) == 3000
    # without ranges, the image is downloaded as before
    resp, _ = conn.request({"op": "load", "version": 2, "images": True, **base})
    assert resp["ok"] and resp["image"]["temporary"] and resp["image"]["path"].endswith(".img"), resp
    # with rangeReads off too
    off = {**base, "options": {**base["options"], "rowImages.rangeReads": "false"}}
    resp, _ = conn.request({"op": "load", "version": 2, "images": True, "ranges": True, **off})
    assert resp["ok"] and resp["image"]["temporary"], resp


def test_a_deferred_load_answers_with_the_image_and_its_changes_come_by_token_or_from_storage(compacted):
    """``defer``: the image's tail comes from the manifest (format 6) and the reply carries only it, with a token;
    ``changesAfterImage`` takes the changes by it once; without the token (a new worker) they are read again from
    what the request names; a commit id or image storage no longer holds is StaleState."""
    conn, base, _ = compacted
    resp, body = conn.request({"op": "load", "version": 2, "images": True, "ranges": True, "defer": True, **base})
    assert resp["ok"] and resp["bytesRead"] == 0, resp
    image, token = resp["image"], resp["deferred"]
    ((end_start, end),) = image["tail"]
    assert len(body) == end - end_start, "the tail only: the changes come later"
    assert resp["rows"] == 2   # the changes' rows before folding
    ask = {"op": "changesAfterImage", "version": 2, "commitId": resp["commitId"], "file": image["file"], **base}
    expected = [({"k": 0}, None), ({"k": 1}, {"n": 100})]
    for deferred in (token, token, "not-a-token"):   # taken once; then read from storage as a new worker would
        got, rows = conn.request({**ask, "deferred": deferred})
        assert got["ok"] and got["rows"] == 2 and got["bytesRead"] > 0, got
        table = ipc_to_table(rows)
        assert sorted(zip(table.column("key").to_pylist(), table.column("value").to_pylist()),
                      key=lambda r: r[0]["k"]) == expected
    for wrong in ({"commitId": "0" * 16}, {"file": "shared/v0000000001-image-0000.img"}):
        got, _ = conn.request({**ask, "deferred": "gone", **wrong})
        assert not got["ok"] and got["kind"] == "StaleState" and "load it again" in got["error"], got
    for bad in ({"deferred": 7}, {"file": None}, {"commitId": ""}, {"checkpointId": 3}):
        got, _ = conn.request({**ask, "deferred": token, **bad})
        assert not got["ok"] and got["kind"] == "ProtocolError", got
    # no deferral without it asked for, nor for a version with nothing after its image
    resp, body = conn.request({"op": "load", "version": 2, "images": True, "ranges": True, **base})
    assert resp["ok"] and "deferred" not in resp and len(body) > end - end_start, resp
    resp, body = conn.request({"op": "load", "version": 1, "images": True, "ranges": True, "defer": True, **base})
    assert resp["ok"] and "deferred" not in resp and resp["rows"] == 0 and resp["image"]["tail"], resp


@pytest.mark.parametrize("bad", [
    {"file": "/etc/passwd"}, {"file": "../1/shared/x.img"}, {"file": "shared/../../x"}, {"file": ""}, {"file": 7},
    {"ranges": []}, {"ranges": [[5, 5]]}, {"ranges": [[-1, 4]]}, {"ranges": [[0, "9"]]}, {"ranges": [[0, 1, 2]]},
    {"ranges": [[0, 1.5]]}, {"ranges": "0-9"}, {"ranges": [[0, 300 << 20]]},
])
def test_fetch_refuses_what_is_not_a_file_of_the_store_or_not_a_range(compacted, bad):
    conn, base, _ = compacted
    resp, _ = conn.request({"op": "load", "version": 2, "images": True, "ranges": True, **base})
    request = {"op": "fetch", "file": resp["image"]["file"], "ranges": [[0, 8]], **base, **bad}
    resp, body = conn.request(request)
    assert not resp["ok"] and resp["kind"] == "ProtocolError" and body == b"", resp
    resp, _ = conn.request({"op": "latest", **base})   # the connection is still in step
    assert resp["version"] == 2


def test_fetch_past_the_end_or_of_a_vanished_file_is_damage(compacted):
    """Not the file the manifest names (kind ChecksumMismatch): the shim drops the image and loads rows, where a
    failed read of storage (kind StorageError) would fail the task for its retry to read the image again."""
    conn, base, bucket = compacted
    resp, _ = conn.request({"op": "load", "version": 2, "images": True, "ranges": True, **base})
    image = resp["image"]
    resp, _ = conn.request({"op": "fetch", "file": image["file"], "ranges": [[image["size"] - 4, image["size"] + 4]],
                            **base})
    assert not resp["ok"] and resp["kind"] == "ChecksumMismatch" and "shorter than the manifest" in resp["error"], resp
    import fsspec

    fsspec.filesystem("s3").rm_file(image["id"].removeprefix("s3://"))
    resp, _ = conn.request({"op": "fetch", "file": image["file"], "ranges": [[0, 8]], **base})
    assert not resp["ok"] and resp["kind"] == "ChecksumMismatch" and "missing" in resp["error"], resp


def test_a_validate_naming_a_remote_root_sets_its_storage_up_once_in_the_background(tmp_path):
    """The shim validates its options when a provider starts and when the executor plugin prestarts the worker:
    a remote ``checkpointRoot`` there has the worker import its fsspec backend, make its client (s3fs: ~0.4 s)
    and send it one request, in the background, once per root, so the executor's first restore pays for none of
    it; a local root, nothing. The worker reaches S3 through a proxy that counts its requests."""
    from tests.support.s3_proxy import S3Proxy
    from tests.support.waiting import wait_until

    endpoint = s3_server.start()
    proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), tmp_path / "proxy")
    worker = Worker(tmp_path, env={"AWS_ENDPOINT_URL": proxy.url})
    try:
        conn = worker.connect()
        root = f"s3://warm-{uuid.uuid4().hex[:8]}/state"   # the bucket need not exist
        for _ in range(2):
            resp, _ = conn.request({"op": "validate", "options": {"checkpointRoot": root}})
            assert resp["ok"], resp
        done = f"storage warm-up of {root} done"
        wait_until(lambda: done in worker.log_path.read_text(errors="replace"), 30, f"no '{done}' in the worker's log")
        requests = proxy.stats()["requests"]
        assert 1 <= requests <= 3, f"the warm-up sent {requests} requests to storage"
        resp, _ = conn.request({"op": "validate", "options": {"checkpointRoot": f"file://{tmp_path}/local"}})
        assert resp["ok"], resp   # a local root: no backend to set up, nothing logged
        log = worker.log_path.read_text(errors="replace")
        assert log.count("storage warm-up of") == 1, log
        assert proxy.stats()["requests"] == requests, "a second validate of the root warmed it up again"
    finally:
        worker.close()
        proxy.stop()
