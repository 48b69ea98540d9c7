"""The worker's background work: one job per key waiting at a time (a newer argument merged in), failures
logged and survived, ``drain`` waiting for what is queued; and the commits that leave their chain due for
compaction queue it there at once, outside the commit, for the newest version committed meanwhile.

A gate job holds the one background thread where a test needs jobs to stay queued; nothing here waits on a
clock (drain's timeout is only ever 0 or long enough never to be reached)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from spark_state.errors import ProtocolError
from spark_state.worker.background import BackgroundWork
from spark_state.worker.protocol import table_to_ipc
from spark_state.worker.server import Dispatcher
from tests.support.changes import typed_changes

LONG = 600.0


@pytest.fixture
def work():
    background = BackgroundWork()
    yield background
    background.close()


def gate(work: BackgroundWork) -> threading.Event:
    """Occupies the background thread until the returned event is set."""
    opened, running = threading.Event(), threading.Event()

    def hold(_):
        running.set()
        opened.wait()

    work.submit(("gate", id(opened)), hold, None)
    running.wait()
    return opened


def test_a_key_has_one_waiting_job_which_takes_the_merged_argument(work):
    opened = gate(work)
    ran = []
    assert work.submit("a", ran.append, 3, max)
    assert not work.submit("a", ran.append, 7, max) and not work.submit("a", ran.append, 5, max)
    assert work.submit("b", ran.append, "b")
    assert work.pending == 3 and work.drain(0) == 3
    opened.set()
    assert work.drain(LONG) == 0
    assert ran == [7, "b"]
    assert work.submit("a", ran.append, 1)   # nothing waits under "a" any more
    assert work.drain(LONG) == 0 and ran == [7, "b", 1]


def test_a_failing_job_is_logged_and_the_next_one_runs(work, caplog):
    ran = []
    work.submit("bad", lambda _: 1 / 0, None)
    work.submit("good", ran.append, "ok")
    assert work.drain(LONG) == 0 and ran == ["ok"]
    assert "background job bad failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_drain_with_nothing_queued_answers_at_once(work):
    assert work.drain(0) == 0 and work.drain(LONG) == 0


# ----------------------------------------------------------------- compaction queued by commits

KEY, VALUE = pa.struct([("k", pa.int64())]), pa.struct([("sum", pa.int64()), ("count", pa.int64())])


def changes(keys: range, value: int = 1) -> bytes:
    rows = [({"k": k}, {"sum": value, "count": 1}) for k in keys]
    return table_to_ipc(typed_changes(rows, KEY, VALUE, hash_of=lambda key: key["k"] * 31 - 700))


@pytest.fixture
def dispatcher(tmp_path):
    d = Dispatcher("secret", cache_dir=str(tmp_path / "cache"))
    yield d
    d.close()


def header(tmp_path, op: str, **fields) -> dict:
    """A request on one store with row images for any snapshot and long chains."""
    root = tmp_path / "ckpt" / "state"
    return {"op": op, "store": {"sparkRoot": f"file:{root}", "location": f"file:{root}/0/0", "operator": 0,
                                "partition": 0, "name": "default", "queryId": "q-1"},
            "options": {"rowImages.minRows": "0", "snapshotInterval": "100", "fileGracePeriod": "0"}, **fields}


def request(dispatcher: Dispatcher, tmp_path, op: str, body: bytes = b"", **fields) -> dict:
    reply, _ = dispatcher.handle(header(tmp_path, op, **fields), body)
    assert reply["ok"], reply
    return reply


def view(dispatcher: Dispatcher, tmp_path, version: int):
    """The version as storage holds it (manifest, compaction record)."""
    return dispatcher._store(header(tmp_path, "load")).reader.view(version)


def test_a_commit_queues_its_due_compaction_outside_the_commit_for_the_newest_version(dispatcher, tmp_path):
    """Each of three commits leaves the chain due (a first snapshot without its image, then deltas holding
    half its rows): the compaction waits behind the gate, not in the commits, and is queued once; it then
    compacts the newest version into a snapshot with its row image."""
    opened = gate(dispatcher.background)
    request(dispatcher, tmp_path, "commit", changes(range(100)), version=1)
    request(dispatcher, tmp_path, "commit", changes(range(50, 100), 2), version=2, keys=100)
    request(dispatcher, tmp_path, "commit", changes(range(100, 160), 3), version=3, keys=160)
    assert all(view(dispatcher, tmp_path, v).record is None for v in (1, 2, 3))   # nothing ran in a commit
    assert request(dispatcher, tmp_path, "drain", timeoutMs=0)["pending"] == 2   # the gate and one compaction
    opened.set()
    assert request(dispatcher, tmp_path, "drain", timeoutMs=int(LONG * 1000))["pending"] == 0
    record = view(dispatcher, tmp_path, 3).record
    assert record is not None and record.snapshot.rows == 160 and record.snapshot.image is not None
    lazy = request(dispatcher, tmp_path, "load", version=3, images=True)
    assert lazy["image"]["rows"] == 160 and lazy["rows"] == 0 and lazy["keys"] == 160


def test_a_commit_whose_chain_is_not_due_queues_nothing(dispatcher, tmp_path):
    request(dispatcher, tmp_path, "commit", changes(range(100)), version=1)
    assert request(dispatcher, tmp_path, "drain", timeoutMs=int(LONG * 1000))["pending"] == 0
    assert view(dispatcher, tmp_path, 1).manifest.files[0].image is None   # the image is in the record
    assert view(dispatcher, tmp_path, 1).record.snapshot.image is not None
    opened = gate(dispatcher.background)
    request(dispatcher, tmp_path, "commit", changes(range(10), 2), version=2)   # 10 of 100 rows: not due
    assert request(dispatcher, tmp_path, "drain", timeoutMs=0)["pending"] == 1   # the gate alone
    opened.set()


@pytest.mark.parametrize("timeout", [-1, "soon", None])
def test_drain_needs_a_timeout(dispatcher, timeout):
    with pytest.raises(ProtocolError, match="timeoutMs"):
        dispatcher.handle({"op": "drain", "timeoutMs": timeout}, b"")


def test_a_store_whose_compaction_waits_its_turn_is_not_evicted(dispatcher, tmp_path, monkeypatch):
    """The worker drops stores idle for STORE_IDLE_SECONDS, but not one with background work still queued:
    that job holds the store object, and a new object for the same store beside it would compact the chain
    with locks and pins of its own while the old one does. Once the job ran, the idle store goes as before."""
    import spark_state.chain.registry as registry

    opened = gate(dispatcher.background)
    try:
        request(dispatcher, tmp_path, "commit", changes(range(100)), version=1)
        request(dispatcher, tmp_path, "commit", changes(range(50, 100), 2), version=2, keys=100)
        assert request(dispatcher, tmp_path, "drain", timeoutMs=0)["pending"] == 2   # the gate and the compaction
        held = dispatcher._store(header(tmp_path, "load"))
        monkeypatch.setattr(registry, "STORE_IDLE_SECONDS", 0.0)
        dispatcher._store(header(tmp_path / "another", "load"))   # another query's request evicts idle stores
        assert any(s is held for s in registry._STORES.values()), "evicted with its compaction queued"
    finally:
        opened.set()
    assert request(dispatcher, tmp_path, "drain", timeoutMs=int(LONG * 1000))["pending"] == 0
    assert view(dispatcher, tmp_path, 2).record is not None   # the queued compaction ran, on that store
    dispatcher._store(header(tmp_path / "another", "load"))
    assert not any(s is held for s in registry._STORES.values()), "an idle store with nothing queued stays"
