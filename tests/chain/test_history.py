"""A store's history (spark_state/chain/history.py): each version's changes as its commit wrote them, across
compaction and retention, and a clear error for every batch that is no longer recorded."""

from __future__ import annotations

import pytest

from spark_state.errors import HistoryUnavailable, VersionNotFound
from tests.support.changes import KEYS, as_dict, changes, checked_dict
from tests.support.stores import store_on

#: What each version's commit changes (None = delete): a key written, rewritten, deleted, written again.
BATCHES = {
    1: {KEYS[0]: b"a1", KEYS[1]: b"b1", KEYS[2]: b"c1"},
    2: {KEYS[0]: b"a2", KEYS[3]: b"d2"},
    3: {KEYS[1]: None, KEYS[4]: b"e3"},
    4: {KEYS[0]: None, KEYS[1]: b"b4"},
    5: {KEYS[2]: b"c5"},
    6: {},
    7: {KEYS[3]: None, KEYS[5]: b"f7"},
    8: {KEYS[4]: b"e8"},
}


def committed(store, upto: int) -> None:
    for v in range(1, upto + 1):
        store.commit(v, changes(BATCHES[v]))


def history_of(store, start: int, end: int) -> dict[int, dict]:
    return {v: as_dict(t) for v, t in store.history.changes(start, end)}


def state_at(version: int) -> dict:
    state: dict = {}
    for v in range(1, version + 1):
        for k, value in BATCHES[v].items():
            if value is None:
                state.pop(k, None)
            else:
                state[k] = value
    return state


def test_each_version_yields_the_changes_its_commit_made(tmp_path):
    store = store_on(f"file://{tmp_path}", snapshot_interval=100)
    committed(store, 8)
    assert history_of(store, 1, 8) == BATCHES   # version 1 is a snapshot: all its rows are puts
    assert history_of(store, 3, 4) == {3: BATCHES[3], 4: BATCHES[4]}


def test_compaction_keeps_every_retained_versions_changes_and_later_chains_keep_older_deltas(tmp_path):
    store = store_on(f"file://{tmp_path}", snapshot_interval=3)
    committed(store, 6)
    store.maintenance(2)   # compacts version 6; retention keeps manifests 5 and 6
    assert store.versions() == [5, 6]
    # manifest 5 still names the chain it was committed on (snapshot 1, deltas 2..5): all of it is history
    assert history_of(store, 1, 6) == {v: BATCHES[v] for v in range(1, 7)}
    store.commit(7, changes(BATCHES[7]))   # builds on the compacted snapshot of 6
    store.commit(8, changes(BATCHES[8]))
    store.maintenance(2)
    assert store.versions() == [7, 8]
    assert history_of(store, 7, 8) == {7: BATCHES[7], 8: BATCHES[8]}
    with pytest.raises(HistoryUnavailable) as err:
        list(store.history.changes(2, 8))
    message = str(err.value)
    assert "batches 1-5" in message and "minBatchesToRetain" in message
    assert "complete from batch 6 on" in message


def compacted_history(tmp_path):
    """Versions 1..8, compacted at 6 and retained around 8: the changes of 1..6 are gone."""
    store = store_on(f"file://{tmp_path}", snapshot_interval=3)
    committed(store, 6)
    store.maintenance(2)
    store.commit(7, changes(BATCHES[7]))
    store.commit(8, changes(BATCHES[8]))
    store.maintenance(2)
    return store


def test_a_request_beyond_history_yields_nothing_before_the_error(tmp_path):
    store = compacted_history(tmp_path)
    tables = []
    with pytest.raises(HistoryUnavailable):
        for version, table in store.history.changes(1, 8):
            tables.append(table)
    assert tables == []


def test_a_version_written_whole_has_no_recorded_changes(tmp_path):
    store = store_on(f"file://{tmp_path}", snapshot_interval=100)
    committed(store, 3)
    store.commit(4, changes(state_at(4)), full=True)   # a shim switching file formats ships its whole state
    store.commit(5, changes(BATCHES[5]))
    assert history_of(store, 5, 5) == {5: BATCHES[5]}
    with pytest.raises(HistoryUnavailable, match=r"batches 3 were written as a whole state"):
        list(store.history.changes(2, 5))


def test_bad_ranges(tmp_path):
    store = store_on(f"file://{tmp_path}")
    committed(store, 3)
    with pytest.raises(VersionNotFound):
        list(store.history.changes(1, 4))
    with pytest.raises(HistoryUnavailable, match="versions start at 1"):
        list(store.history.changes(0, 2))
    with pytest.raises(HistoryUnavailable, match="earlier batch"):
        store.history.replay(3, 2)


def test_replay_from_any_retained_version_is_the_state_at_the_end(tmp_path):
    store = compacted_history(tmp_path)
    for snapshot in (7, 8):
        for end in range(snapshot, 9):
            assert checked_dict(store.history.replay(snapshot, end).sort_by("kg")) == state_at(end)
    with pytest.raises(VersionNotFound):   # manifest 6 itself is gone
        store.history.replay(6, 8)
