"""Streamed commits (spark_state.chain.staging, worker/streams.py): a commit whose changes came in chunks while
the batch ran leaves the same state as one whole commit, nothing of it is visible before the commit, and an
abort or a lost stream leaves no file behind."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.errors import ProtocolError, StreamLost, VersionNotFound
from spark_state.format import datafile
from spark_state.format.manifest import SNAPSHOT
from spark_state.worker.streams import StreamRegistry
from tests.chain.test_typed_files import _frozen, _thaw, as_dict, batches, table
from tests.support.changes import M, opaque_changes
from tests.support.stores import assert_files_of_kept_versions_exist, store_on


def _split(t: pa.Table, cuts: list[int]) -> list[pa.Table]:
    """`t` cut at the given row positions (chunks as a shim streams them; empty ones dropped)."""
    bounds = sorted({0, t.num_rows, *(c % (t.num_rows + 1) for c in cuts)})
    return [t.slice(a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a]


def _commit_streamed(store, version: int, changes: pa.Table, cuts: list[int], base, **kwargs):
    """Commits `changes` as a shim streams them: all chunks but the last staged, the last sent with the commit."""
    chunks = _split(changes, cuts)
    staged = store.stage(version)
    for chunk in chunks[:-1]:
        staged.append(chunk)
    tail = chunks[-1] if chunks else changes
    return store.commit(version, tail, base_commit_id=base, staged=staged, **kwargs)


@pytest.mark.parametrize("storage", ["file", "memory"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(chain=batches, cuts=st.lists(st.integers(0, 10), max_size=4), compact=st.booleans())
def test_streamed_commits_leave_the_state_of_whole_commits(tmp_path_factory, storage, chain, cuts, compact):
    root = tmp_path_factory.mktemp("s")
    url = f"file://{root}" if storage == "file" else f"memory://{root}"
    streamed, whole = store_on(url + "/streamed"), store_on(url + "/whole")
    model: dict = {}
    base_s = base_w = None
    for version, step in enumerate(chain, start=1):
        rows = [(_thaw(k), v) for k, v in step.items()]
        if version == 1:   # a first version holds no deletes a shim would send (it removes only what it has)
            rows = [(k, v) for k, v in rows if v is not None]
        for k, v in rows:
            if v is None:
                model.pop(_frozen(k), None)
            else:
                model[_frozen(k)] = _frozen(v)
        changes = table(rows)
        base_s = _commit_streamed(streamed, version, changes, cuts, base_s).commit_id
        base_w = whole.commit(version, changes, base_commit_id=base_w).commit_id
        if compact:
            streamed.maintenance(2)
        assert as_dict(streamed.load(version)) == model == as_dict(whole.load(version))
        loaded = streamed.load(version)
        assert (np.diff(loaded.column("kg").to_numpy()) >= 0).all(), "a load is in key-group order"
        wanted = np.array([1, 5, 7], dtype=np.int32)
        sub = streamed.load(version, key_groups=wanted)
        assert as_dict(sub) == {k: v for k, v in model.items() if k in
                                {_frozen(x) for x, kg in zip(loaded.column("key").to_pylist(),
                                                             loaded.column("kg").to_pylist()) if kg in wanted}}
    assert_files_of_kept_versions_exist(streamed)


def _rows(keys, value=1):
    return table([({"user": k, "window": None, "tags": None},
                   None if value is None else {"total": value, "price": None, "name": k, "state": None,
                                               "timeoutTimestamp": -1}) for k in keys])


def test_a_first_version_is_written_as_it_arrived_and_compaction_orders_it(tmp_path):
    store = store_on(f"file://{tmp_path}", snapshot_interval=2)
    staged = store.stage(1)
    staged.append(_rows(["b", "a"]))
    result = store.commit(1, _rows(["ü", ""]), staged=staged)
    [entry] = store.reader.read_manifest(1).files
    assert entry.kind == SNAPSHOT and entry.rows == 4 and entry.path == staged.path
    stored = datafile.decode((tmp_path / entry.path).read_bytes(), entry.path, M)
    assert [k["user"] for k in stored.column("key").to_pylist()] == ["b", "a", "ü", ""], "rows in arrival order"
    second = store.commit(2, _rows(["a"], 2), base_commit_id=result.commit_id)
    store.commit(3, _rows(["b"], 3), base_commit_id=second.commit_id)
    store.maintenance(1)
    snapshot = store.reader.view(3).chain[0]
    kg = datafile.decode((tmp_path / snapshot.path).read_bytes(), snapshot.path, M).column("kg").to_numpy()
    assert snapshot.version == 3 and (np.diff(kg) >= 0).all(), "the compacted snapshot is in key-group order"


def test_nothing_streamed_is_visible_before_the_commit_and_an_abort_leaves_no_file(tmp_path):
    store = store_on(f"file://{tmp_path}")
    staged = store.stage(1)
    staged.append(_rows(["a", "b"]))
    assert (tmp_path / staged.path).exists(), "chunks go to the file as they come"
    with pytest.raises(VersionNotFound):
        store.load(1)
    staged.discard()
    assert not (tmp_path / staged.path).exists()
    with pytest.raises(ProtocolError, match="already committed or dropped"):
        store.commit(1, _rows([]), staged=staged)
    assert store.versions() == []


@pytest.mark.parametrize("case", ["repeated keys", "deletes in a first version"])
def test_a_stream_the_commit_cannot_use_as_written_is_rewritten(tmp_path, case):
    store = store_on(f"file://{tmp_path}")
    staged = store.stage(1)
    if case == "repeated keys":
        staged.append(_rows(["a", "b"], 1))
        result = store.commit(1, _rows(["a"], 2), staged=staged, repeated_keys=True)
        expected = {"a": 2, "b": 1}
    else:
        staged.append(_rows(["a", "b"], 1))
        result = store.commit(1, _rows(["a"], None), staged=staged, repeated_keys=True)
        expected = {"b": 1}
    got = store.load(1)
    assert {k["user"]: v["total"] for k, v in zip(got.column("key").to_pylist(), got.column("value").to_pylist())} \
        == expected
    assert result.commit_id
    assert not (tmp_path / staged.path).exists(), "the streamed file was replaced"
    assert set(store.storage.list_files()) == set(store.reader.read_manifest(1).paths)


def test_chunks_with_another_schema_are_refused(tmp_path):
    store = store_on(f"file://{tmp_path}")
    staged = store.stage(1)
    staged.append(_rows(["a"]))
    other = pa.table({"kg": pa.array([1], pa.int32()), "hash": pa.array([1], pa.int32()),
                      "key": pa.array([{"x": 1}]), "value": pa.array([{"y": 2}])})
    with pytest.raises(ProtocolError, match="schema"):
        staged.append(other)


def test_the_registry_orders_chunks_and_says_when_a_stream_is_lost(tmp_path):
    store = store_on(f"file://{tmp_path}")
    streams = StreamRegistry()
    with pytest.raises(StreamLost, match="send them again"):
        streams.append("s1", 1, store, 1, _rows(["a"]))   # chunk 0 never came (a restarted worker)
    streams.append("s1", 0, store, 1, _rows(["a"]))
    streams.append("s1", 0, store, 1, _rows(["a"]))       # a retried request: taken once
    with pytest.raises(StreamLost):
        streams.append("s1", 2, store, 1, _rows(["ü"]))   # chunk 1 missing
    streams.append("s1", 1, store, 1, _rows(["b"]))
    with pytest.raises(ProtocolError, match="belongs to"):
        streams.append("s1", 2, store, 2, _rows(["ü"]))
    with pytest.raises(StreamLost, match="holds 2 of the 3"):
        streams.take("s1", 3, store, 1)
    assert len(streams) == 0 and store.storage.list_files() == [], "a stream that cannot commit is dropped"
    streams.append("s2", 0, store, 1, _rows(["a", "b"]))
    staged = streams.take("s2", 1, store, 1)
    store.commit(1, _rows(["ü"]), staged=staged)
    assert store.load(1).num_rows == 3
    with pytest.raises(StreamLost):
        streams.take("s2", 1, store, 1)


def test_an_idle_stream_is_dropped_with_its_file(tmp_path):
    store = store_on(f"file://{tmp_path}")
    streams = StreamRegistry(idle_limit=0.0)
    streams.append("old", 0, store, 1, _rows(["a"]))
    [path] = store.storage.list_files()
    streams.append("new", 0, store, 2, _rows(["b"]))   # any request sweeps idle streams
    assert path not in store.storage.list_files() and len(streams) == 1
    streams.idle_limit = 3600.0
    assert streams.drop("new") and store.storage.list_files() == []
    assert not streams.drop("new")


def _spark_like(keys: list[int], deletes: bool) -> pa.Table:
    """Changes as the shim encodes a store whose value fields Spark declares non-nullable: a delete is a null
    value struct whose children are null too (found by the micro benchmark: a batch updating keys twice)."""
    kf = [pa.field("k", pa.int64(), nullable=False)]
    vf = [pa.field("a", pa.int64(), nullable=False), pa.field("s", pa.string(), nullable=False)]
    hashes = np.array(keys, dtype=np.int32)
    value = pa.StructArray.from_arrays(
        [pa.array([None if deletes else k for k in keys], pa.int64()),
         pa.array([None if deletes else f"v{k}" for k in keys], pa.string())],
        fields=vf, mask=pa.array([deletes] * len(keys)))
    return pa.table({"kg": pa.array(np.mod(hashes, M), pa.int32()), "hash": pa.array(hashes),
                     "key": pa.StructArray.from_arrays([pa.array(keys, pa.int64())], fields=kf), "value": value},
                    schema=pa.schema([("kg", pa.int32()), ("hash", pa.int32()),
                                      pa.field("key", pa.struct(kf), nullable=False), ("value", pa.struct(vf))]))


@pytest.mark.parametrize("tail_deletes", [False, True])
def test_repeated_keys_with_non_nullable_value_fields_are_rewritten(tmp_path, tail_deletes):
    store = store_on(f"file://{tmp_path}")
    first = store.commit(1, _spark_like([1, 2, 3], deletes=False))
    staged = store.stage(2)
    staged.append(_spark_like([1, 2], deletes=False))
    store.commit(2, _spark_like([2, 3], deletes=tail_deletes), base_commit_id=first.commit_id, staged=staged,
                 repeated_keys=True)
    got = store.load(2)
    assert sorted(k["k"] for k in got.column("key").to_pylist()) == ([1] if tail_deletes else [1, 2, 3])


def test_a_chunk_sent_twice_at_once_is_written_once(tmp_path):
    """Two attempts of one chunk in the worker at the same time (a request retried while the first still
    writes): one writes it, the other is told it was taken; the next chunk is not mistaken for a retry."""
    import threading

    store = store_on(f"file://{tmp_path}")
    streams = StreamRegistry()
    streams.append("s", 0, store, 1, _rows(["a"]))
    barrier = threading.Barrier(2)
    original = store.committer.valid_changes

    def slow_validate(changes, repeated_keys=False):
        barrier.wait(timeout=5)   # both attempts are past the registry when either writes
        return original(changes, repeated_keys)

    staged = streams._streams["s"]
    staged._validate = slow_validate
    threads = [threading.Thread(target=streams.append, args=("s", 1, store, 1, _rows(["b"]))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    staged._validate = original
    streams.append("s", 2, store, 1, _rows(["ü"]))
    store.commit(1, _rows([]), staged=streams.take("s", 3, store, 1))
    assert sorted(k["user"] for k in store.load(1).column("key").to_pylist()) == ["a", "b", "ü"]


def test_deletes_in_the_tail_of_a_streamed_first_version_are_not_stored(tmp_path):
    """A delete of a key the store never had (the worker drops those) in the tail of a first version: the
    snapshot holds no null value and counts only its rows."""
    store = store_on(f"file://{tmp_path}")
    staged = store.stage(1)
    staged.append(_rows(["a", "b"]))
    store.commit(1, _rows(["ü"], None), staged=staged)
    assert store.reader.read_manifest(1).files[0].rows == 2
    assert sorted(k["user"] for k in store.load(1).column("key").to_pylist()) == ["a", "b"]


def _opaque_chain(store) -> str:
    """Versions 1 and 2 in file format 1 (a checkpoint of a spark_state older than typed files); 2's commit id."""
    c1 = store.commit(1, opaque_changes({b"k1": b"v1"}, max_parallelism=M))
    return store.commit(2, opaque_changes({b"k22": b"v2"}, max_parallelism=M), base_commit_id=c1.commit_id).commit_id


def test_a_whole_state_streamed_as_a_snapshot_is_the_version_as_written(tmp_path):
    """The shim's upgrade of a format-1 chain sends its whole state as chunks too (``stage`` with ``full``): the
    file as streamed is the version's snapshot, a new chain, and nothing is read back into memory."""
    store = store_on(f"file://{tmp_path}")
    base = _opaque_chain(store)
    staged = store.stage(3, full=True)
    assert staged.kind == SNAPSHOT
    for part in (["a", "b"], ["ü"]):
        staged.append(_rows(part))
    store.commit(3, _rows([""]), base_commit_id=base, full=True, staged=staged, keys=4)
    [entry] = store.reader.read_manifest(3).files
    assert entry.kind == SNAPSHOT and entry.typed and entry.path == staged.path and entry.rows == 4
    got = store.load(3)
    assert sorted(k["user"] for k in got.column("key").to_pylist()) == ["", "a", "b", "ü"]


@pytest.mark.parametrize("case", ["staged as changes, committed whole", "staged whole, committed as changes"])
def test_a_stream_of_the_other_kind_than_its_commit_is_rewritten(tmp_path, case):
    store = store_on(f"file://{tmp_path}")
    if case.startswith("staged as changes"):
        base = _opaque_chain(store)
        staged = store.stage(3)
        staged.append(_rows(["a", "b"]))
        store.commit(3, _rows(["ü"]), base_commit_id=base, full=True, staged=staged)
        expected, version = ["a", "b", "ü"], 3
    else:
        first = store.commit(1, _rows([""]))
        staged = store.stage(2, full=True)
        staged.append(_rows(["a", "b"]))
        store.commit(2, _rows(["ü"]), base_commit_id=first.commit_id, staged=staged)
        expected, version = ["", "a", "b", "ü"], 2
    got = store.load(version)
    assert sorted(k["user"] for k in got.column("key").to_pylist()) == expected
    assert not (tmp_path / staged.path).exists(), "the streamed file was replaced"
    assert set(store.storage.list_files()) >= set(store.reader.read_manifest(version).paths)
