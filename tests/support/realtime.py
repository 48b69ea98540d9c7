"""Spark 4.3's real-time mode (``trigger(realTime=...)``) on one machine: Spark's own ``LowLatencyMemoryStream``
(a real-time source in Spark's SQL jar, read through py4j) as input, a ``foreach`` sink (real-time mode allows
foreach, console and Kafka sinks) appending every output row to files the test reads.

Real-time mode sets ``spark.sql.streaming.stateStore.checkpointFormatVersion=2`` whenever the session has not
set it, so a stateful real-time query needs a provider that supports checkpoint ids."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.support.spark import provider_conf, sql_conf

LOW_LATENCY_STREAM = "org.apache.spark.sql.execution.streaming.sources.LowLatencyMemoryStream"
#: Real-time mode runs every stage of a batch at once (a pipelined shuffle), and Spark refuses a query whose stages
#: need more task slots than the cluster has: one source partition and one state partition fit local[2].
PARTITIONS = 1


def has_real_time_mode(spark: SparkSession) -> bool:
    """Whether this Spark has real-time mode and its in-memory real-time source (Spark 4.3+)."""
    from pyspark.sql.streaming import DataStreamWriter

    if "realTime" not in DataStreamWriter.trigger.__code__.co_varnames:
        return False
    try:
        spark._jvm.java.lang.Class.forName(LOW_LATENCY_STREAM)
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False
    return True


class Source:
    """A LowLatencyMemoryStream of "key,value" strings with PARTITIONS partitions; rows go to the partition the
    test names, so a restarted query (a new source given the same rows first) sees every row at its offset."""

    def __init__(self, spark: SparkSession):
        jvm = spark._jvm
        self.spark = spark
        self._jvm = jvm
        self.stream = jvm.org.apache.spark.sql.execution.streaming.sources.LowLatencyMemoryStream.apply(
            spark._jsparkSession, PARTITIONS, jvm.org.apache.spark.sql.Encoders.STRING())

    def add(self, rows: list[tuple[str, int]]) -> None:
        """Adds rows, each to partition hash(key) mod PARTITIONS (deterministic across runs)."""
        by_partition: dict[int, list[str]] = {}
        for key, value in rows:
            by_partition.setdefault(sum(key.encode()) % PARTITIONS, []).append(f"{key},{value}")
        for partition, lines in sorted(by_partition.items()):
            items = self._jvm.java.util.ArrayList()
            for line in lines:
                items.add(line)
            self.stream.addData(partition, self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(items))

    def df(self) -> DataFrame:
        raw = DataFrame(self.stream.toDF(), self.spark)
        parts = F.split(F.col("value"), ",")
        return raw.select(parts.getItem(0).alias("k"), parts.getItem(1).cast("long").alias("v"))


def _append_row(out_dir: str, row) -> None:
    """The foreach sink: one JSON line per output row, in a file per process (foreach runs in Python workers)."""
    path = os.path.join(out_dir, f"rows-{os.getpid()}.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(row.asDict(), sort_keys=True) + "\n")


@dataclass
class RealTimeQuery:
    """One real-time query on one provider and checkpoint; each ``run`` feeds a new source every row so far
    (the restarted query resumes at its committed offsets) and stops once ``done(rows)`` holds."""

    spark: SparkSession
    build: Callable[[DataFrame], DataFrame]
    checkpoint: Path
    provider: str
    mode: str
    conf: dict = field(default_factory=dict)
    out: Path | None = None
    fed: list = field(default_factory=list)

    def __post_init__(self):
        self.out = Path(self.out or f"{self.checkpoint}-out")
        self.out.mkdir(parents=True, exist_ok=True)

    def rows(self) -> list[dict]:
        return [json.loads(line) for p in sorted(self.out.glob("rows-*.jsonl")) for line in p.read_text().splitlines()]

    def run(self, new_rows: list[tuple[str, int]], done: Callable[[list[dict]], bool], timeout: float = 120) -> None:
        import functools

        source = Source(self.spark)
        if self.fed:
            source.add(self.fed)
        self.fed = self.fed + list(new_rows)
        with sql_conf(self.spark, {**provider_conf(self.provider), "spark.sql.shuffle.partitions": str(PARTITIONS),
                                   **self.conf}):
            query = (self.build(source.df()).writeStream.outputMode(self.mode)
                     .option("checkpointLocation", str(self.checkpoint))
                     .queryName(f"rt_{uuid.uuid4().hex[:8]}")
                     .foreach(functools.partial(_append_row, str(self.out)))
                     .trigger(realTime="5 seconds").start())
        try:
            source.add(new_rows)
            deadline = time.monotonic() + timeout
            while not done(self.rows()):
                if query.exception() is not None:
                    raise AssertionError(f"real-time query on {self.provider} failed: {query.exception()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"real-time query on {self.provider} did not produce its output in "
                                         f"{timeout}s; rows so far: {self.rows()}")
                time.sleep(0.2)
            # the batch that processed the rows commits its state at its end: wait for two commits more (the
            # batch running now and the next), then stop
            committed = _committed(self.checkpoint)
            while _committed(self.checkpoint) < committed + 2:
                if time.monotonic() > deadline:
                    raise AssertionError(f"real-time query on {self.provider} committed no batch in {timeout}s")
                if query.exception() is not None:
                    raise AssertionError(f"real-time query on {self.provider} failed: {query.exception()}")
                time.sleep(0.2)
        finally:
            query.stop()


def _committed(checkpoint: Path) -> int:
    commits = Path(checkpoint) / "commits"
    return max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1) if commits.exists() else -1
