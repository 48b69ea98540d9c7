"""The worker as the JVM shim meets it: a real process, a real Unix socket, real frames."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from spark_state.worker.protocol import ipc_to_table, read_frame, table_to_ipc
from tests.support.changes import opaque_changes, typed_changes
from tests.support.worker_client import Worker


@pytest.fixture
def worker(tmp_path):
    w = Worker(tmp_path)
    yield w
    w.close()


def _store(tmp_path: Path) -> dict:
    root = tmp_path / "ckpt" / "state"
    return {"sparkRoot": f"file:{root}", "location": f"file:{root}/0/1",
            "operator": 0, "partition": 1, "name": "default"}


def _changes(rows: list[tuple[bytes, bytes | None]]) -> pa.Table:
    """Changes hashed by key length (the worker checks kg == pmod(hash, maxParallelism))."""
    return opaque_changes(dict(rows))


def test_commit_then_load_round_trips_through_the_socket(worker, tmp_path):
    conn = worker.connect()
    assert conn.hello["ok"] and conn.hello["pid"] == worker.pid
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem"}}
    resp, _ = conn.request({"op": "commit", "version": 1, **base},
                      table_to_ipc(_changes([(b"a", b"1"), (b"bb", b"2")])))
    assert resp["ok"], resp
    resp, _ = conn.request({"op": "commit", "version": 2, **base},
                      table_to_ipc(_changes([(b"a", None), (b"ccc", b"3")])))
    assert resp["ok"], resp
    resp, body = conn.request({"op": "load", "version": 2, **base})
    assert resp["ok"] and resp["rows"] == 2
    loaded = ipc_to_table(body)
    assert sorted(zip(loaded["key"].to_pylist(), loaded["value"].to_pylist())) == [(b"bb", b"2"), (b"ccc", b"3")]
    store_dir = tmp_path / "ckpt" / "state" / "0" / "1"
    data_files = [p for p in store_dir.rglob("*") if p.is_file() and p.parent.name == "shared"]
    assert len(data_files) == 2 and resp["bytesRead"] == sum(p.stat().st_size for p in data_files), (
        "bytesRead: both versions' files", resp, data_files)
    resp, _ = conn.request({"op": "latest", **base})
    assert resp["version"] == 2
    assert list((tmp_path / "ckpt" / "state" / "0" / "1").iterdir()), "files must be under Spark's store directory"


def test_missing_version_and_bad_option_are_clear_errors(worker, tmp_path):
    conn = worker.connect()
    resp, _ = conn.request({"op": "load", "version": 5, "store": _store(tmp_path), "options": {}})
    assert not resp["ok"] and resp["kind"] == "VersionNotFound"
    resp, _ = conn.request({"op": "validate", "options": {"storage": "tape"}})
    assert not resp["ok"] and resp["kind"] == "OptionError"
    assert "filesystem" in resp["error"] and "memory" in resp["error"]
    # memoryLimit and imageCacheSize: null when unset (the shim computes the defaults), else bytes
    assert conn.request({"op": "validate", "options": {}})[0] == {"ok": True, "memoryLimit": None,
                                                                  "imageCacheSize": None}
    assert conn.request({"op": "validate", "options": {"memoryLimit": "145m", "rowImages.cacheSize": "2g"}})[0] \
        == {"ok": True, "memoryLimit": 145 << 20, "imageCacheSize": 2 << 30}
    resp, _ = conn.request({"op": "frobnicate"})
    assert not resp["ok"] and resp["kind"] == "ProtocolError"


def test_wrong_secret_is_refused(worker):
    conn = worker.connect(secret="guess")
    assert not conn.hello["ok"] and "authentication" in conn.hello["error"]
    assert conn.stream.read(1) == b"", "the worker must close the connection"


def test_socket_is_private(worker):
    assert (worker.dir / "worker.sock").stat().st_mode & 0o077 == 0


def test_worker_exits_when_its_parent_closes_stdin(worker):
    worker.proc.stdin.close()
    deadline = time.monotonic() + 10
    while worker.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.proc.poll() is not None, "worker outlived the stdin of the process that started it"
    assert not (worker.dir / "worker.sock").exists()


def test_worker_exits_when_its_parent_is_killed(tmp_path):
    """A parent killed with SIGKILL (like a crashed executor JVM) leaves no worker behind."""
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'spark_state.worker', '--socket-dir', {str(tmp_path)!r}],"
        " stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        "p.stdin.write(b'x\\n'); p.stdin.flush()\n"
        "print(p.stdout.readline().decode().split()[1], flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    worker_pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(worker_pid, signal.SIGKILL)
    pytest.fail("worker survived its killed parent")


def test_commit_ids_guard_against_stale_views(worker, tmp_path):
    """The protocol of docs/consistency.md: load tells the commit id, commit checks its base's."""
    conn = worker.connect()
    base = {"store": {**_store(tmp_path), "queryId": "q-1"}, "options": {"storage": "filesystem"}}
    first, _ = conn.request({"op": "commit", "version": 1, "baseCommitId": None, **base},
                       table_to_ipc(_changes([(b"a", b"1")])))
    assert first["ok"] and first["commitId"] and first["maintenanceFailures"] == 0
    same, body = conn.request({"op": "load", "version": 1, "commitId": first["commitId"], **base})
    assert same == {"ok": True, "unchanged": True, "commitId": first["commitId"], "keys": 1, "bytesRead": 0}
    assert body == b""
    retried, _ = conn.request({"op": "commit", "version": 1, "baseCommitId": None, **base},
                         table_to_ipc(_changes([(b"a", b"2")])))
    stale, _ = conn.request({"op": "commit", "version": 2, "baseCommitId": first["commitId"], **base},
                       table_to_ipc(_changes([(b"bb", b"3")])))
    assert not stale["ok"] and stale["kind"] == "StaleState", stale
    fresh, body = conn.request({"op": "load", "version": 1, "commitId": first["commitId"], **base})
    assert fresh["commitId"] == retried["commitId"] and ipc_to_table(body)["value"].to_pylist() == [b"2"]
    ok, _ = conn.request({"op": "commit", "version": 2, "baseCommitId": retried["commitId"], **base},
                    table_to_ipc(_changes([(b"bb", b"3")])))
    assert ok["ok"], ok
    queued, _ = conn.request({"op": "maintenance", "version": 2, "minVersionsToRetain": 2, **base})
    assert queued["ok"] and "maintenanceFailures" in queued


def test_an_unauthenticated_peer_cannot_make_the_worker_allocate(worker):
    """The first frame is read with a small header cap and no body, before the secret is checked."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(worker.dir / "worker.sock"))
    stream = sock.makefile("rwb")
    header = b'{"op":"hello","secret":"guess"}'
    stream.write(len(header).to_bytes(4, "big") + header + (1 << 40).to_bytes(8, "big"))
    stream.flush()
    resp, _ = read_frame(stream)
    assert not resp["ok"] and "larger than 0" in resp["error"]
    assert worker.proc.poll() is None


def _typed_changes(rows: list[tuple[int, int | None]]) -> pa.Table:
    """Typed changes (struct key {k: long}, value {n: long}, null = delete), kg and hash as the worker checks them."""
    return typed_changes([({"k": k}, None if v is None else {"n": v}) for k, v in rows],
                         pa.struct([("k", pa.int64())]), pa.struct([("n", pa.int64())]), hash_of=lambda key: key["k"] * 7)


def test_a_change_log_naming_a_key_twice_keeps_the_last_row(worker, tmp_path):
    """The shim appends each put/remove to its change log as it happens: with ``repeatedKeys`` a key may be in it
    more than once (updated twice, put then removed, removed then put) and the last row wins; the delta file
    still holds one row per key."""
    from spark_state.format import datafile as snapshot
    from spark_state.options import DEFAULT_MAX_PARALLELISM

    conn = worker.connect()
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem"}}
    resp, _ = conn.request({"op": "commit", "version": 1, **base},
                           table_to_ipc(_typed_changes([(1, 10), (2, 20), (3, 30)])))
    assert resp["ok"], resp
    log = [(1, 11), (1, 12), (4, 40), (4, None), (2, None), (2, 21), (3, None), (5, 50), (5, 51)]
    resp, _ = conn.request({"op": "commit", "version": 2, "repeatedKeys": True, **base},
                           table_to_ipc(_typed_changes(log)))
    assert resp["ok"], resp
    resp, body = conn.request({"op": "load", "version": 2, **base})
    assert resp["ok"], resp
    loaded = ipc_to_table(body)
    assert sorted((k["k"], v["n"]) for k, v in zip(loaded["key"].to_pylist(), loaded["value"].to_pylist())) == [
        (1, 12), (2, 21), (5, 51)]
    deltas = [p for p in (tmp_path / "ckpt").rglob("*") if p.is_file() and "delta" in p.name]
    assert len(deltas) == 1, deltas
    delta = snapshot.decode(deltas[0].read_bytes(), deltas[0].name, DEFAULT_MAX_PARALLELISM)
    assert sorted(k["k"] for k in delta["key"].to_pylist()) == [1, 2, 3, 4, 5]


def test_changes_and_replay_through_the_socket(worker, tmp_path):
    """The ops behind Spark's change feed and snapshot replay: each version's recorded changes (deletes kept),
    the range checked up front, and the state rebuilt from an earlier version."""
    conn = worker.connect()
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem"}}
    for version, rows in [(1, [(b"a", b"1"), (b"bb", b"2")]), (2, [(b"a", None), (b"ccc", b"3")])]:
        resp, _ = conn.request({"op": "commit", "version": version, **base}, table_to_ipc(_changes(rows)))
        assert resp["ok"], resp
    resp, body = conn.request({"op": "changes", "version": 2, "through": 2, **base})
    assert resp["ok"] and resp["rows"] == 2
    changed = ipc_to_table(body)
    assert sorted(zip(changed["key"].to_pylist(), changed["value"].to_pylist())) == [(b"a", None), (b"ccc", b"3")]
    resp, _ = conn.request({"op": "changes", "version": 1, "through": 3, **base})
    assert not resp["ok"] and resp["kind"] == "VersionNotFound"
    resp, body = conn.request({"op": "replay", "snapshotVersion": 1, "version": 2, **base})
    loaded = ipc_to_table(body)
    assert resp["ok"] and resp["commitId"]
    assert sorted(zip(loaded["key"].to_pylist(), loaded["value"].to_pylist())) == [(b"bb", b"2"), (b"ccc", b"3")]



def test_key_counts_through_the_socket(worker, tmp_path):
    """A commit's ``keys`` is recorded and a load answers it; a lazy load (a row image and the changes after
    it) answers it only when known; a count that is not one is a ProtocolError and commits nothing."""
    conn = worker.connect()
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem", "rowImages.minRows": "0",
                                                    "snapshotInterval": "100"}}
    resp, _ = conn.request({"op": "commit", "version": 1, **base},
                           table_to_ipc(_typed_changes([(k, k) for k in range(10)])))
    assert resp["ok"], resp
    resp, _ = conn.request({"op": "drain", "timeoutMs": 60_000})   # the first snapshot's image, queued by the commit
    assert resp == {"ok": True, "pending": 0}, resp
    resp, _ = conn.request({"op": "commit", "version": 2, "keys": 9, **base},
                           table_to_ipc(_typed_changes([(0, None), (1, 100)])))
    assert resp["ok"], resp
    resp, _ = conn.request({"op": "commit", "version": 3, **base}, table_to_ipc(_typed_changes([(2, None)])))
    assert resp["ok"], resp
    for version, keys in [(1, 10), (2, 9), (3, None)]:
        lazy, _ = conn.request({"op": "load", "version": version, "images": True, **base})
        assert lazy["ok"] and "image" in lazy and lazy.get("keys") == keys, lazy
        whole, body = conn.request({"op": "load", "version": version, **base})
        assert whole["keys"] == whole["rows"] == ipc_to_table(body).num_rows == 10 - (version > 1) - (version > 2)
    for bad in (-1, "9", True, 1.5):
        resp, _ = conn.request({"op": "commit", "version": 4, "keys": bad, **base},
                               table_to_ipc(_typed_changes([(3, 3)])))
        assert not resp["ok"] and resp["kind"] == "ProtocolError" and "'keys' must be an integer" in resp["error"]
    resp, _ = conn.request({"op": "latest", **base})
    assert resp["version"] == 3


def test_a_streamed_commit_refused_for_its_header_keeps_no_stray_file_and_abort_still_finds_it(tmp_path):
    """A commit that names a stream but is refused (a bad count, or a stream of another version) must not leave
    the staged data file in no registry: refused before the stream is taken, the stream stays for the shim's
    abort; refused once taken, its file goes with it."""
    from spark_state.errors import ProtocolError
    from spark_state.worker.server import Dispatcher

    d = Dispatcher("s", cache_dir=str(tmp_path / "images"))
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem"}}
    shared = tmp_path / "ckpt" / "state" / "0" / "1" / "shared"

    def staged_files() -> list[Path]:
        return [p for p in shared.rglob("*") if p.is_file()] if shared.exists() else []

    chunk = table_to_ipc(_typed_changes([(1, 10), (2, 20)]))
    d.handle({"op": "stage", "version": 1, "stream": "s1", "seq": 0, **base}, chunk)
    with pytest.raises(ProtocolError, match="keys"):
        d.handle({"op": "commit", "version": 1, "stream": "s1", "chunks": 1, "keys": -1, **base}, b"")
    assert len(d.streams) == 1, "a commit refused for its header took the stream: no abort can drop its file"
    d.handle({"op": "abort", "version": 1, "stream": "s1", **base}, b"")
    assert len(d.streams) == 0

    d.handle({"op": "stage", "version": 2, "stream": "s2", "seq": 0, **base}, chunk)
    assert staged_files(), "the chunk was not written where the test looks"
    with pytest.raises(ProtocolError, match="belongs to"):
        d.handle({"op": "commit", "version": 3, "stream": "s2", "chunks": 1, **base}, b"")
    assert len(d.streams) == 0 and not staged_files(), staged_files()
    d.background.close()


def test_a_shim_gone_mid_reply_leaves_no_traceback_in_the_worker_log(worker, tmp_path):
    """A task killed while its load's rows stream back closes the socket under the worker's write: an ordinary
    cancellation, which the worker's log must not report as an exception with a traceback."""
    conn = worker.connect()
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem"}}
    resp, _ = conn.request({"op": "commit", "version": 1, **base},
                           table_to_ipc(_typed_changes([(k, k) for k in range(200_000)])))
    assert resp["ok"], resp
    conn.send({"op": "load", "version": 1, **base})   # several MB back: more than the socket buffers hold
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.sock.close()
    again = worker.connect()   # the worker still serves
    resp, _ = again.request({"op": "latest", **base})
    assert resp["ok"] and resp["version"] == 1, resp
    again.close()
    time.sleep(0.5)
    log = worker.log_path.read_text()
    assert "Traceback" not in log and "Exception occurred" not in log, log[-3000:]


def test_the_worker_never_loads_pandas(worker, tmp_path):
    """pyarrow's ``to_numpy`` imports pandas whenever it is installed (it is here: pyspark's pandas API needs
    it), 45-50 MiB of the worker's resident memory. A commit, a compaction that writes a row image, and
    loads of both kinds run without it, and with the right rows."""
    import importlib.util

    assert importlib.util.find_spec("pandas") is not None, "the test needs pandas installed to mean anything"
    conn = worker.connect()
    base = {"store": _store(tmp_path), "options": {"storage": "filesystem", "rowImages.minRows": "0",
                                                    "snapshotInterval": "2"}}
    for version, rows in [(1, [(k, k) for k in range(1000)]), (2, [(k, None) for k in range(10)])]:
        resp, _ = conn.request({"op": "commit", "version": version, **base}, table_to_ipc(_typed_changes(rows)))
        assert resp["ok"], resp
        resp, _ = conn.request({"op": "drain", "timeoutMs": 60_000})
        assert resp == {"ok": True, "pending": 0}, resp
    lazy, _ = conn.request({"op": "load", "version": 2, "images": True, **base})
    assert lazy["ok"] and "image" in lazy, lazy
    whole, body = conn.request({"op": "load", "version": 2, **base})
    assert whole["rows"] == ipc_to_table(body).num_rows == 990
    time.sleep(0.5)   # the warm-up runs in the background (its kernels call to_numpy too)
    mapped = Path(f"/proc/{worker.pid}/maps").read_text()
    assert "/pandas/" not in mapped, [line for line in mapped.splitlines() if "/pandas/" in line][:3]
