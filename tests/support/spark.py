"""Harness for the end-to-end tests: the session builder, and real streaming queries on one shared SparkSession.

A test describes a query once (a function from the session to a streaming
DataFrame) and runs it in *phases*: before each phase it adds input files,
then every query of the test runs to completion with ``trigger(availableNow)``
and stops, so each phase boundary is a stop and a restart from the same
``checkpointLocation``. Input files are read one per micro-batch, so batch
numbering is deterministic and outputs can be compared batch by batch.

``Twin`` runs the same query on Spark's HDFS provider (the reference) and on
the provider under test, over the same files, and compares them.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from pyspark.sql import DataFrame, Row, SparkSession

from spark_state import PROVIDER_CLASS
from spark_state.options import PREFIX
from spark_state.spark.config import KEYWORDS, option_conf
from tests.support.paths import LOG4J, pythonpath_with_root

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark's checkpoint format: 2 names every state store version by a checkpoint id (Spark's HDFS provider refuses it)
CHECKPOINT_FORMAT = "spark.sql.streaming.stateStore.checkpointFormatVersion"
SPARK_STATE_PROVIDER = PROVIDER_CLASS
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


def ts(seconds: float) -> str:
    """An event time ``seconds`` after a fixed epoch, as the JSON reader parses it (UTC)."""
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def spark_builder(app_name: str = "spark_state tests"):
    """The builder the tests (and their child processes) use: small, quiet, deterministic."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers import the UDFs from the test modules by name.
    os.environ["PYTHONPATH"] = pythonpath_with_root()
    return (
        SparkSession.builder.master("local[2]").appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "2s")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J}")
        .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J}")
    )


# ----------------------------------------------------------------- configuration

@contextmanager
def sql_conf(spark: SparkSession, conf: Mapping[str, str | None]) -> Iterator[None]:
    """Sets SQL confs (None = unset) and restores the previous values afterwards."""
    saved = {k: spark.conf.get(k, None) for k in conf}
    try:
        _apply_conf(spark, conf)
        yield
    finally:
        _apply_conf(spark, saved)


def _apply_conf(spark: SparkSession, conf: Mapping[str, str | None]) -> None:
    for key, value in conf.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def provider_conf(provider: str, **options: Any) -> dict[str, str | None]:
    """The SQL confs that select ``provider`` ("spark_state", "hdfs" or "rocksdb") with spark_state ``options``."""
    if provider in ("hdfs", "rocksdb"):
        if options:
            raise TypeError(f"Spark's {provider} provider takes no spark_state options, got {sorted(options)}")
        return {PROVIDER_KEY: HDFS_PROVIDER if provider == "hdfs" else ROCKSDB_PROVIDER}
    if provider != "spark_state":
        raise ValueError(f"unknown provider {provider!r}; use 'spark_state', 'hdfs' or 'rocksdb'")
    conf: dict[str, str | None] = {PROVIDER_KEY: SPARK_STATE_PROVIDER}
    conf.update({PREFIX + KEYWORDS[name]: None for name, value in options.items() if value is None})
    conf.update(option_conf(**{name: value for name, value in options.items() if value is not None}))
    return conf


# ----------------------------------------------------------------------- inputs

#: File modification times increase with every file written by any stream, so
#: the file source (which orders new files by mtime) reads them in write order.
_mtimes = itertools.count(int(time.time()) - 1_000_000)


class JsonStream:
    """A directory of JSON-lines files read as a stream, one file per micro-batch."""

    def __init__(self, path: Path, schema: str):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.files = 0

    def add(self, rows: list[dict]) -> None:
        """Adds one file (= one micro-batch of this stream)."""
        name = self.path / f"part-{self.files:05d}.json"
        tmp = self.path / f".part-{self.files:05d}.json.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        mtime = next(_mtimes)
        os.utime(tmp, (mtime, mtime))
        tmp.rename(name)
        self.files += 1

    def add_all(self, files: list[list[dict]]) -> None:
        """Adds one file per list of rows (= one micro-batch each), in order."""
        for rows in files:
            self.add(rows)

    def read(self, spark: SparkSession) -> DataFrame:
        return (spark.readStream.schema(self.schema)
                .option("maxFilesPerTrigger", 1).json(str(self.path)))


# ---------------------------------------------------------------------- queries

def plain(value: Any) -> Any:
    """Rows and structs as tuples, recursively, so outputs compare and sort."""
    if isinstance(value, Row):
        return tuple(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, plain(v)) for k, v in value.items()))
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def sort_rows(rows) -> list:
    return sorted((plain(r) for r in rows), key=repr)


class QueryFailed(AssertionError):
    """The streaming query stopped with an error; ``message`` is Spark's text."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass
class Query:
    """One streaming query on one provider and checkpoint, run once per phase.

    ``outputs`` maps batch id -> sorted output rows; a batch that is run again
    after a failure replaces its earlier output, as an idempotent sink would.
    """

    spark: SparkSession
    build: Callable[[SparkSession], DataFrame]
    checkpoint: Path
    mode: str = "update"
    provider: str = "spark_state"
    options: dict = field(default_factory=dict)
    conf: dict = field(default_factory=dict)
    timeout: float = 180.0
    #: called in the driver after each batch's output is collected (state committed), before the next
    on_batch: Callable[[int], None] | None = None
    outputs: dict[int, list] = field(default_factory=dict)
    runs: int = 0
    #: the last committed batch id after each successful run
    run_ends: list[int] = field(default_factory=list)
    #: every batch's progress (StreamingQueryProgress as a dict), in order
    progress: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.checkpoint = Path(self.checkpoint)

    def run(self) -> list[int]:
        """Runs the query over all input available now, then stops it. Returns the new batch ids.

        Raises QueryFailed with Spark's message if the query fails.
        """
        before = set(self.outputs)
        with sql_conf(self.spark, {**provider_conf(self.provider, **self.options), **self.conf}):
            df = self.build(self.spark)

            def collect(batch: DataFrame, batch_id: int) -> None:
                self.outputs[batch_id] = sort_rows(batch.collect())
                if self.on_batch is not None:
                    self.on_batch(batch_id)

            query = (df.writeStream.outputMode(self.mode)
                     .option("checkpointLocation", str(self.checkpoint))
                     .foreachBatch(collect).trigger(availableNow=True).start())
        self.runs += 1
        try:
            finished = query.awaitTermination(self.timeout)
        except Exception as err:  # StreamingQueryException
            raise QueryFailed(str(err)) from None
        if not finished:
            query.stop()
            raise AssertionError(f"query on {self.provider} did not finish within {self.timeout}s")
        self.progress.extend(p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress)
        self.run_ends.append(self.last_batch())
        return sorted(set(self.outputs) - before)

    def rows(self) -> list:
        """Every output row of every batch, sorted."""
        return sorted((r for rows in self.outputs.values() for r in rows), key=repr)

    def last_batch(self) -> int:
        """The id of the last committed batch (from the checkpoint's commit log)."""
        commits = [int(p.name) for p in (self.checkpoint / "commits").iterdir() if p.name.isdigit()]
        return max(commits)


class Twin:
    """The same query on the HDFS provider (reference; ``reference="rocksdb"`` for what HDFS cannot run, such as
    checkpoint format v2) and on the provider under test.

    Both read the same input files; ``run()`` runs one phase of each (start,
    process everything available, stop), so calling it again after adding
    files restarts both from their checkpoints.
    """

    def __init__(self, spark: SparkSession, workdir: Path, build: Callable[[SparkSession], DataFrame], *,
                 mode: str = "update", tested: str = "spark_state", options: dict | None = None,
                 conf: dict | None = None, reference: str = "hdfs"):
        self.workdir = Path(workdir)
        opts = dict(options or {}) if tested == "spark_state" else {}
        self.ref = Query(spark, build, self.workdir / f"ckpt-{reference}", mode=mode, provider=reference,
                         conf=dict(conf or {}))
        self.test = Query(spark, build, self.workdir / "ckpt-test", mode=mode, provider=tested,
                          options=opts, conf=dict(conf or {}))

    def run(self) -> None:
        self.ref.run()
        self.test.run()

    def assert_same(self) -> None:
        """Outputs are identical batch by batch."""
        assert self.test.outputs == self.ref.outputs, _diff(self.ref.outputs, self.test.outputs)


def _diff(ref: dict, got: dict) -> str:
    lines = ["output differs from the reference provider's (batch: expected / got):"]
    for b in sorted(set(ref) | set(got)):
        if ref.get(b) != got.get(b):
            lines.append(f"  batch {b}:\n    expected {ref.get(b)}\n    got      {got.get(b)}")
    return "\n".join(lines)


# ----------------------------------------------------------------- state reading

def statestore_rows(spark: SparkSession, checkpoint: Path, **options: Any) -> list:
    """Spark's own ``statestore`` reader over a checkpoint, rows sorted as tuples (not spark_state.read_state)."""
    reader = spark.read.format("statestore")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return sort_rows(reader.load(str(checkpoint)).collect())


def rm_rf(path: Path, timeout: float = 30.0) -> None:
    """``rm -rf`` of a stopped query's checkpoint (or part of it), as its user would run it.

    ``query.stop()`` does not wait for executors' background maintenance (Spark's own providers
    neither): a compaction already running may still write one file while the tree is removed
    (rmtree then fails with "Directory not empty") and retention may delete one rmtree listed.
    Removing again ends because compaction never re-creates a deleted store; this retry would hide
    that regression, which tests/chain/test_store.py and tests/unit/test_storage.py check instead.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError:   # a file written, or one deleted by retention, under rmtree's feet
            if not Path(path).exists():
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def arrow_rows(table) -> list:
    """A pyarrow Table's rows as sorted tuples the way ``plain`` makes Spark's rows: structs positionally
    (Spark's field names may repeat), timestamps as naive UTC datetimes (the session time zone is UTC)."""
    import pyarrow as pa

    def values(array) -> list:
        if pa.types.is_struct(array.type):
            children = [values(array.field(i)) for i in range(array.type.num_fields)]
            valid = array.is_valid().to_pylist()
            return [tuple(c[i] for c in children) if valid[i] else None for i in range(len(array))]
        if pa.types.is_timestamp(array.type) and array.type.tz is not None:
            array = array.cast(pa.timestamp(array.type.unit))
        return [plain(v) for v in array.to_pylist()]

    table = table.combine_chunks()
    columns = [values(table.column(i).chunk(0) if table.column(i).num_chunks else
                      pa.array([], table.schema.field(i).type)) for i in range(table.num_columns)]
    return sorted((tuple(c[i] for c in columns) for i in range(table.num_rows)), key=repr)
