"""applyInPandasWithState end to end: every timeout kind and output mode, stopped and
restarted half-way, on both storages, gives exactly the HDFS provider's output."""

from __future__ import annotations

import pytest

from tests.support.running_total import PHASES, SCHEMA, build_query
from tests.support.spark import NO_DATA_BATCHES, JsonStream


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
