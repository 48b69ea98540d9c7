"""Every stateful operator as a small streaming query with fixed input in two phases.

A scenario's input is a list of phases; a phase is a list of steps; a step
adds one file to each named stream (= one micro-batch). Between the two phases
every query is stopped and restarted from its checkpoint. Event times run past
the watermark so windows, duplicates, sessions and join rows are evicted.

``run_scenario`` runs one on HDFS and on the provider under test (a Twin);
conftest caches the runs per session so the operator tests and the state
reader tests share them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from tests.support import running_total as aip
from tests.support.spark import JsonStream, Twin, ts

EVENTS = "k string, v long, ts timestamp"
LEFT = "k string, lv long, lts timestamp"
RIGHT = "k string, rv long, rts timestamp"


def e(k: str, v: int, t: float) -> dict:
    return {"k": k, "v": v, "ts": ts(t)}


#: One stream of events: keys a-e, 10 s windows, 5 s watermark delay. The query
#: restarts after phase 1; a@2 in phase 2 is late (dropped with a watermark),
#: b@15 repeats (a duplicate), and d@62 pushes the watermark to 57 so every
#: earlier window, session and duplicate is evicted.
EVENT_PHASES = [
    [
        {"events": [e("a", 1, 1), e("b", 2, 2), e("c", 3, 3), e("a", 4, 4)]},
        {"events": [e("a", 5, 11), e("d", 6, 12), e("b", 7, 15)]},
    ],
    [
        {"events": [e("a", 8, 21), e("c", 9, 23), e("a", 1, 2), e("e", 2, 25), e("b", 7, 15)]},
        {"events": [e("b", 3, 41), e("a", 4, 43), e("a", 6, 44), e("d", 5, 62)]},
    ],
]


def _l(k, v, t):
    return {"k": k, "lv": v, "lts": ts(t)}


def _r(k, v, t):
    return {"k": k, "rv": v, "rts": ts(t)}


#: Two streams for the joins: rows match when keys are equal and event times are
#: within 5 s; b, d and x never match; z@60 pushes both watermarks past them.
JOIN_PHASES = [
    [
        {"left": [_l("a", 1, 1), _l("b", 2, 2)], "right": [_r("a", 10, 3)]},
        {"left": [_l("c", 3, 12), _l("d", 4, 14)], "right": [_r("c", 30, 13), _r("x", 99, 12)]},
    ],
    [
        {"left": [_l("e", 5, 22), _l("a", 6, 23)], "right": [_r("a", 60, 24), _r("e", 50, 21), _r("a", 61, 2)]},
        {"left": [_l("z", 7, 60)], "right": [_r("z", 70, 61)]},
    ],
]


def running_count(key, pdfs, state):
    """applyInPandasWithState: emits each key's running count and sum (append mode)."""
    import pandas as pd

    (k,) = key
    count, total = state.get if state.exists else (0, 0)
    last = None
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["v"].sum())
        last = pdf["ts"].max()
    state.update((count, total))
    yield pd.DataFrame({"k": [k], "count": [count], "total": [total], "ts": [last]})


@dataclass
class Scenario:
    name: str
    build: Callable[..., DataFrame]   # build(spark, **streaming DataFrames by stream name)
    mode: str
    streams: dict[str, str] = field(default_factory=lambda: {"events": EVENTS})
    phases: list = field(default_factory=lambda: EVENT_PHASES)
    conf: dict = field(default_factory=dict)
    #: state stores per operator, for the state reader: {operator id: [store names]}
    stores: dict = field(default_factory=lambda: {0: ["default"]})


def _timeouts(events):
    """applyInPandasWithState with event-time timeouts: the running total of tests/support/running_total.py, each
    key timing out 10 s of event time after its last event; the watermark of phase 2 times most keys out (their
    state removed, found by Spark's walk of the whole store)."""
    return (events.withWatermark("ts", "5 seconds").groupBy("k")
            .applyInPandasWithState(functools.partial(aip.running_total, "EventTimeTimeout"), aip.OUTPUT_SCHEMA,
                                    aip.STATE_SCHEMA, "update", GroupStateTimeout.EventTimeTimeout))


def _window_agg(events):
    return (events.withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k").agg(F.sum("v").alias("sum"), F.count("*").alias("n")))


def _join(left, right, how):
    left = left.withWatermark("lts", "5 seconds")
    right = right.withWatermark("rts", "5 seconds").withColumnRenamed("k", "rk")
    cond = F.expr("k = rk AND rts >= lts - interval 5 seconds AND rts <= lts + interval 5 seconds")
    return left.join(right, cond, how)


JOIN_STORES = ["left-keyToNumValues", "left-keyWithIndexToValue",
               "right-keyToNumValues", "right-keyWithIndexToValue"]

SCENARIOS = {s.name: s for s in [
    Scenario("agg_update", lambda spark, events: events.groupBy("k").agg(
        F.sum("v").alias("sum"), F.count("*").alias("n")), "update"),
    Scenario("agg_complete", lambda spark, events: events.groupBy("k").agg(
        F.sum("v").alias("sum"), F.max("ts").alias("last")), "complete"),
    Scenario("agg_watermark_update", lambda spark, events: events.withWatermark("ts", "5 seconds")
             .groupBy("k", "ts").agg(F.sum("v").alias("sum")), "update"),
    Scenario("window_agg_update", lambda spark, events: _window_agg(events), "update"),
    Scenario("window_agg_append", lambda spark, events: _window_agg(events), "append"),
    Scenario("window_agg_complete", lambda spark, events: _window_agg(events), "complete"),
    Scenario("dedup", lambda spark, events: events.dropDuplicates(["k"]), "append"),
    Scenario("dedup_watermark", lambda spark, events: events.withWatermark("ts", "5 seconds")
             .dropDuplicates(["k", "ts"]), "append"),
    Scenario("dedup_within_watermark", lambda spark, events: events.withWatermark("ts", "5 seconds")
             .dropDuplicatesWithinWatermark(["k"]), "append"),
    Scenario("session_window", lambda spark, events: events.withWatermark("ts", "5 seconds")
             .groupBy(F.session_window("ts", "5 seconds"), "k")
             .agg(F.sum("v").alias("sum"), F.count("*").alias("n")), "append"),
    Scenario("join_inner", lambda spark, left, right: _join(left, right, "inner"), "append",
             streams={"left": LEFT, "right": RIGHT}, phases=JOIN_PHASES, stores={0: JOIN_STORES}),
    Scenario("join_left_outer", lambda spark, left, right: _join(left, right, "left_outer"), "append",
             streams={"left": LEFT, "right": RIGHT}, phases=JOIN_PHASES, stores={0: JOIN_STORES}),
    Scenario("apply_in_pandas_then_window_agg", lambda spark, events: (
        events.withWatermark("ts", "5 seconds").groupBy("k")
        .applyInPandasWithState(running_count, "k string, count long, total long, ts timestamp",
                                "count long, total long", "append", "NoTimeout")
        .withWatermark("ts", "5 seconds")
        .groupBy(F.window("ts", "10 seconds")).agg(F.sum("count").alias("counts"))), "append",
        stores={0: ["default"], 1: ["default"]}),
]}

#: applyInPandasWithState with event-time timeouts (not in SCENARIOS: the operator tests run that query in
#: tests/spark/test_apply_in_pandas_with_state.py; the large-state tests run it under a tiny memory limit).
TIMEOUTS = Scenario("apply_in_pandas_timeouts", lambda spark, events: _timeouts(events), "update")


def run_scenario(spark: SparkSession, workdir: Path, scenario: Scenario, *, tested: str,
                 options: dict | None = None, between: Callable[[Twin], None] | None = None,
                 conf: dict | None = None, reference: str = "hdfs") -> Twin:
    """Runs ``scenario`` phase by phase on HDFS (or ``reference``) and on ``tested``; returns the finished Twin.

    ``between(twin)`` is called after each phase but the last, the queries stopped (rescale, savepoint and
    restore happen there). ``conf``: Spark conf of both queries, beside the scenario's own."""
    streams = {name: JsonStream(Path(workdir) / name, schema) for name, schema in scenario.streams.items()}

    def build(session):
        return scenario.build(session, **{name: s.read(session) for name, s in streams.items()})

    twin = Twin(spark, workdir, build, mode=scenario.mode, tested=tested, options=options,
                conf={**scenario.conf, **(conf or {})}, reference=reference)
    for i, phase in enumerate(scenario.phases):
        for step in phase:
            for name, rows in step.items():
                streams[name].add(rows)
        twin.run()
        if between is not None and i < len(scenario.phases) - 1:
            between(twin)
    return twin
