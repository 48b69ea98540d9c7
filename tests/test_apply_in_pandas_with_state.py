"""applyInPandasWithState end to end: every timeout kind and output mode, stopped and
restarted half-way, on both storages, gives exactly the HDFS provider's output."""

from __future__ import annotations

import functools

import pytest

from tests.streaming import NO_DATA_BATCHES, JsonStream, ts

SCHEMA = "k string, v long, ts timestamp"
OUTPUT_SCHEMA = "k string, total long, n long, kind string"
STATE_SCHEMA = "total long, n long"

#: Input files; the query is stopped and restarted after PHASES[0].
PHASES = [
    [
        [{"k": "a", "v": 1, "ts": ts(1)}, {"k": "b", "v": 2, "ts": ts(2)}, {"k": "c", "v": 3, "ts": ts(3)}],
        [{"k": "a", "v": 4, "ts": ts(11)}, {"k": "d", "v": 5, "ts": ts(12)}, {"k": "a", "v": 10, "ts": ts(9)}],
    ],
    [
        [{"k": "b", "v": 6, "ts": ts(21)}, {"k": "e", "v": 7, "ts": ts(22)}],
        [{"k": "a", "v": 8, "ts": ts(40)}, {"k": "e", "v": 9, "ts": ts(41)}, {"k": "c", "v": 100, "ts": ts(5)},
         {"k": "f", "v": 10, "ts": ts(80)}],
    ],
]


def running_total(timeout: str, key, pdfs, state):
    """Sums v per key; emits the total on every update and once more when the key times out."""
    import pandas as pd

    (k,) = key
    if state.hasTimedOut:
        total, n = state.get
        state.remove()
        yield pd.DataFrame({"k": [k], "total": [total], "n": [n], "kind": ["timeout"]})
        return
    total, n = state.get if state.exists else (0, 0)
    max_ts = None
    for pdf in pdfs:
        total += int(pdf["v"].sum())
        n += len(pdf)
        batch_max = int(pdf["ts"].max().value // 1_000_000)
        max_ts = batch_max if max_ts is None else max(max_ts, batch_max)
    state.update((total, n))
    if timeout == "ProcessingTimeTimeout":
        state.setTimeoutDuration(1)
    elif timeout == "EventTimeTimeout":
        state.setTimeoutTimestamp(max(max_ts + 10_000, state.getCurrentWatermarkMs() + 1))
    yield pd.DataFrame({"k": [k], "total": [total], "n": [n], "kind": ["update"]})


def build_query(events: JsonStream, timeout: str, mode: str):
    def build(spark):
        from pyspark.sql.streaming.state import GroupStateTimeout

        events_df = events.read(spark)
        if timeout == "EventTimeTimeout":
            events_df = events_df.withWatermark("ts", "5 seconds")
        return events_df.groupBy("k").applyInPandasWithState(
            functools.partial(running_total, timeout), OUTPUT_SCHEMA, STATE_SCHEMA, mode,
            getattr(GroupStateTimeout, timeout))
    return build


def run_twin(make_twin, tmp_path, timeout, mode, **options):
    events = JsonStream(tmp_path / "events", SCHEMA)
    conf = {}
    if timeout == "ProcessingTimeTimeout":
        # With no-data batches on, a processing-time timeout makes availableNow run
        # empty batches forever; timeouts then fire in the next data batch.
        conf[NO_DATA_BATCHES] = "false"
    twin = make_twin(build_query(events, timeout, mode), mode=mode,
                     options=options, conf=conf)
    for phase in PHASES:
        for rows in phase:
            events.add(rows)
        twin.run()
    return twin


def final_rows(query, kind):
    return sorted((r[0], r[1], r[2]) for r in query.rows() if r[3] == kind)


#: Timeout rows each timeout kind must produce, (key, total, n): two of them only
#: fire after the restart, from state written before it.
EXPECTED_TIMEOUTS = {
    "NoTimeout": [],
    # batch 1: b, c; batch 2 (after the restart): a, d; batch 3: b
    "ProcessingTimeTimeout": [("a", 15, 3), ("b", 2, 1), ("b", 6, 1), ("c", 3, 1), ("d", 5, 1)],
    # c@5 arrives late and is dropped; after the restart watermark 17 fires c, 75 fires the rest
    "EventTimeTimeout": [("a", 23, 4), ("b", 8, 2), ("c", 3, 1), ("d", 5, 1), ("e", 16, 2)],
}


@pytest.mark.parametrize("timeout,mode,storage", [
    ("NoTimeout", "update", "filesystem"),
    ("NoTimeout", "append", "filesystem"),
    ("ProcessingTimeTimeout", "update", "filesystem"),
    ("ProcessingTimeTimeout", "append", "filesystem"),
    ("EventTimeTimeout", "update", "filesystem"),
    ("EventTimeTimeout", "append", "filesystem"),
    ("ProcessingTimeTimeout", "update", "memory"),
    ("EventTimeTimeout", "update", "memory"),
])
def test_same_output_as_hdfs_across_a_restart(make_twin, tmp_path, timeout, mode, storage):
    twin = run_twin(make_twin, tmp_path, timeout, mode, storage=storage)
    twin.assert_same()
    assert twin.test.runs == 2
    # The state continued across the restart: totals count on from the first run's values.
    assert final_rows(twin.test, "timeout") == EXPECTED_TIMEOUTS[timeout]
    updates = final_rows(twin.test, "update")
    if timeout == "NoTimeout":
        assert ("a", 23, 4) in updates and ("c", 103, 2) in updates and ("b", 8, 2) in updates
