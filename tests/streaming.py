"""Harness for the end-to-end tests: real streaming queries on one shared SparkSession.

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
import signal
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

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
SPARK_STATE_PROVIDER = PROVIDER_CLASS
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


def ts(seconds: float) -> str:
    """An event time ``seconds`` after a fixed epoch, as the JSON reader parses it (UTC)."""
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def at(seconds: float) -> datetime:
    """The naive UTC datetime Spark returns for ``ts(seconds)`` (session time zone UTC)."""
    return (EPOCH + timedelta(seconds=seconds)).replace(tzinfo=None)


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
    """The SQL confs that select ``provider`` ("spark_state" or "hdfs") with spark_state ``options``."""
    if provider == "hdfs":
        if options:
            raise TypeError(f"the HDFS provider takes no spark_state options, got {sorted(options)}")
        return {PROVIDER_KEY: HDFS_PROVIDER}
    if provider != "spark_state":
        raise ValueError(f"unknown provider {provider!r}; use 'spark_state' or 'hdfs'")
    conf: dict[str, str | None] = {PROVIDER_KEY: SPARK_STATE_PROVIDER}
    conf.update({PREFIX + KEYWORDS[name]: None for name, value in options.items() if value is None})
    conf.update(option_conf(**{name: value for name, value in options.items() if value is not None}))
    return conf


@contextmanager
def use_provider(spark: SparkSession, provider: str, **options: Any) -> Iterator[None]:
    """Queries started inside use ``provider``; the session's settings come back afterwards.

    Spark records the provider class in the checkpoint's offset log, so a
    restarted query keeps the provider it was first started with; the
    spark_state options are read at each start and must be given again.
    """
    with sql_conf(spark, provider_conf(provider, **options)):
        yield


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
    """The same query on the HDFS provider (reference) and on the provider under test.

    Both read the same input files; ``run()`` runs one phase of each (start,
    process everything available, stop), so calling it again after adding
    files restarts both from their checkpoints.
    """

    def __init__(self, spark: SparkSession, workdir: Path, build: Callable[[SparkSession], DataFrame], *,
                 mode: str = "update", tested: str = "spark_state", options: dict | None = None,
                 conf: dict | None = None):
        self.workdir = Path(workdir)
        opts = dict(options or {}) if tested == "spark_state" else {}
        self.ref = Query(spark, build, self.workdir / "ckpt-hdfs", mode=mode, provider="hdfs",
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
    lines = ["output differs from the HDFS provider's (batch: expected / got):"]
    for b in sorted(set(ref) | set(got)):
        if ref.get(b) != got.get(b):
            lines.append(f"  batch {b}:\n    expected {ref.get(b)}\n    got      {got.get(b)}")
    return "\n".join(lines)


def run_phases(twin: Twin, phases: list[Callable[[], None]]) -> Twin:
    """Before each phase calls its input step, then runs (restarts) both queries."""
    for add_input in phases:
        add_input()
        twin.run()
    return twin


# ----------------------------------------------------------------- state reading

def read_state(spark: SparkSession, checkpoint: Path, **options: Any) -> list:
    """Spark's own ``statestore`` reader over a checkpoint, rows sorted as tuples."""
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
    that regression, which tests/test_state.py and tests/test_storage.py check instead.
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


def wait_until_settled(path: Path, quiet: float = 3.0, timeout: float = 60.0) -> None:
    """Returns once no file under `path` appeared, vanished or changed size for `quiet` seconds.

    After ``query.stop()`` one background maintenance run per store (compaction, retention) may still
    be under way; a test that copies or inspects a stopped query's checkpoint file by file waits for it
    (``quiet`` is above the tests' 2 s maintenance interval; a compaction of these small test
    checkpoints takes milliseconds, so a quiet spell means the run is over).
    """
    def listing():
        out = {}
        for p in Path(path).rglob("*"):
            try:
                out[str(p)] = p.stat().st_size
            except FileNotFoundError:
                pass
        return out

    deadline = time.monotonic() + timeout
    last, since = listing(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise AssertionError(f"files under {path} still changing after {timeout:.0f} s")
        time.sleep(0.5)
        now = listing()
        if now != last:
            last, since = now, time.monotonic()


def store_root(checkpoint: Path, operator: int = 0, partition: int = 0, store_name: str = "default") -> Path:
    """Spark's state directory of one store: ``<ckpt>/state/<op>/<partition>[/<storeName>]``."""
    root = Path(checkpoint) / "state" / str(operator) / str(partition)
    return root if store_name == "default" else root / store_name


# ------------------------------------------------------------------- processes

def driver_jvm_pid(spark: SparkSession) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def worker_pids(parent: int | None = None) -> list[int]:
    """Live processes running ``spark_state.worker`` (children of ``parent`` if given)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if "spark_state.worker" not in _cmdline(pid) or not alive(pid):
            continue
        if parent is None or _ppid(pid) == parent:
            out.append(pid)
    return sorted(out)


def kill_workers(spark: SparkSession) -> list[int]:
    """SIGKILLs the spark_state worker(s) of this driver JVM; returns their pids."""
    pids = worker_pids(driver_jvm_pid(spark))
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), 10, f"worker(s) {pids} still alive after SIGKILL")
    return pids


def wait_until(cond: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(message)


# ------------------------------------------------------------ spark_state's own files

def open_stored(checkpoint: Path, operator: int = 0, partition: int = 0, store_name: str = "default",
                **options: Any):
    """spark_state's VersionedStore of one store of a checkpoint, opened as the worker opens it.

    ``options`` are Settings fields (storage="filesystem" by default); the
    store root is Spark's state directory of the store.
    """
    from spark_state.options import Settings
    from spark_state.chain import forget_stores, open_store
    from spark_state.storage.layout import StoreRef

    forget_stores()  # always read the files, not a cached store
    ref = StoreRef(spark_root="file:" + str(Path(checkpoint) / "state"),
                   location="file:" + str(store_root(checkpoint, operator, partition, store_name)),
                   operator=operator, partition=partition, name=store_name)
    return open_store(ref, Settings(**options))


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
