"""The running-total applyInPandasWithState query many end-to-end tests run: its input in two phases (the
query stops and restarts between them), its schemas, and its function for each timeout kind.

Spark's Python workers import ``running_total`` from this module by name (pickled by reference)."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.support.spark import JsonStream, Twin, ts

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


def flaky_running_total(marker: str, key, pdfs, state):
    """running_total, except that it fails once (the marker file's existence) when it meets key "a". A marker
    holding ``{"stores": pattern}`` (the store directories of the operator's partitions) first waits, 60 s at most,
    until another partition has committed this batch's version (its newest ``chk-N`` is ahead of another
    partition's): the batch then fails after that commit."""
    import glob
    import json
    import os
    import time

    def newest(store: str) -> int:
        # a version counts once its manifest is written (a lineage's is written before it)
        return max((int(os.path.basename(os.path.dirname(p))[4:])
                    for p in glob.glob(os.path.join(store, "chk-*", "_metadata"))), default=0)

    if key[0] == "a" and os.path.exists(marker):
        with open(marker) as f:
            text = f.read().strip()
        if text:
            stores = json.loads(text)["stores"]
            deadline = time.monotonic() + 60
            while len({newest(s) for s in glob.glob(stores)}) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        os.remove(marker)
        raise RuntimeError("injected failure in the middle of a batch")
    yield from running_total("EventTimeTimeout", key, pdfs, state)


def query_with_hook(events: JsonStream, fn, marker: Path):
    """The running-total query with `fn` (running_total with a hook that watches the file `marker`)."""
    def build(spark):
        return (events.read(spark).withWatermark("ts", "5 seconds").groupBy("k")
                .applyInPandasWithState(functools.partial(fn, str(marker)), OUTPUT_SCHEMA,
                                        STATE_SCHEMA, "update", "EventTimeTimeout"))
    return build


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


def twin_under_a_checkpoint_root(spark, workdir: Path) -> tuple[Twin, JsonStream, dict]:
    """The event-time running total on HDFS and on spark_state with its stores under a ``checkpointRoot`` in
    ``workdir``, after the first phase: (the twin, its input, the spark_state options naming the root)."""
    root = {"checkpoint_root": f"file://{workdir}/root"}
    events = JsonStream(Path(workdir) / "events", SCHEMA)
    twin = Twin(spark, workdir, build_query(events, "EventTimeTimeout", "update"), mode="update", options=root)
    events.add_all(PHASES[0])
    twin.run()
    return twin, events, root
