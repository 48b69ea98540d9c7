"""The soak's four concurrent queries, the code they run in the executors, and their lifecycle.

* ``agg``: ``groupBy(k)`` sum, count and the last tick (update mode);
* ``sessions``: ``applyInPandasWithState`` per session key with an event-time timeout; a session's
  row comes out when the watermark passes its timeout, and its state is removed;
* ``dedup``: ``dropDuplicates(id, t)`` with a watermark (append);
* ``join``: a stream-stream inner join of orders and payments with watermarks and a time range (append).

Each ends in a ``mapInPandas`` (``after_commit``) that runs after the state store committed, in the
same task: it fails the task when the fault schedule dropped a marker (a task failure after the
commit), and notes every retry or speculative copy. Output goes through ``foreachBatch`` to one
file per batch id, replaced when a batch runs again (an idempotent sink), so the checks read
exactly what the last run of every batch emitted.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from pyspark.sql import DataFrame, SparkSession

from benchmarks.soak.inputs import DELAY_S, SCHEMAS, TIMEOUT_MS, InputWriter

NAMES = ("agg", "sessions", "dedup", "join")
OUTPUT = {
    "agg": "k string, total long, n long, g long",
    "sessions": "s string, total long, n long, last_ms long",
    "dedup": "id string, t long",
    "join": "oid string, lt long, rt long, amount long",
}
MODES = {"agg": "update", "sessions": "update", "dedup": "append", "join": "append"}
SESSION_STATE = "total long, n long, last_ms long"

# ------------------------------------------------------------------- code run in the executors


def session(key, pdfs, state):
    """A session's running total; when the watermark passes its timeout, its row comes out and the state goes."""
    import pandas as pd

    (s,) = key
    if state.hasTimedOut:
        total, n, last = state.get
        state.remove()
        yield pd.DataFrame({"s": [s], "total": [total], "n": [n], "last_ms": [last]})
        return
    total, n, last = state.get if state.exists else (0, 0, 0)
    for pdf in pdfs:
        total += int(pdf["v"].sum())
        n += len(pdf)
        last = max(last, int(pdf["t"].astype("datetime64[ms]").astype("int64").max()))
    state.update((total, n, last))
    state.setTimeoutTimestamp(last + TIMEOUT_MS)


def after_commit(cfg: dict, batches: Iterator) -> Iterator:
    """Passes every row on; once its input ended (the state committed), notes a retry or speculative copy
    and fails the task if it claims the failure marker (exactly one task claims it: a rename)."""
    from pyspark import TaskContext

    yield from batches
    tc = TaskContext.get()
    batch = tc.getLocalProperty("streaming.sql.batchId")
    where = f"{cfg['query']}-b{batch}-p{tc.partitionId()}-s{tc.stageId()}-a{tc.attemptNumber()}"
    if tc.attemptNumber() > 0:
        Path(cfg["attempts"], where).touch()
    try:
        os.rename(cfg["fail"], f"{cfg['fail']}.taken-{where}")
    except FileNotFoundError:
        return
    raise RuntimeError(f"soak: injected task failure after the state commit ({where})")


# ------------------------------------------------------------------- the driver side


def _read(spark: SparkSession, inputs: InputWriter, stream: str, max_files: int) -> DataFrame:
    return (spark.readStream.schema(SCHEMAS[stream]).option("maxFilesPerTrigger", max_files)
            .json(str(inputs.dir(stream))))


def build(name: str, spark: SparkSession, inputs: InputWriter, max_files: int) -> DataFrame:
    """The query ``name`` without its sink."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    delay = f"{DELAY_S} seconds"
    if name == "agg":
        return (_read(spark, inputs, "events", max_files).groupBy("k")
                .agg(F.sum("v").alias("total"), F.count("*").alias("n"), F.max("g").alias("g")))
    if name == "sessions":
        return (_read(spark, inputs, "events", max_files).withWatermark("t", delay).groupBy("s")
                .applyInPandasWithState(session, OUTPUT["sessions"], SESSION_STATE, "update",
                                        GroupStateTimeout.EventTimeTimeout))
    if name == "dedup":
        return (_read(spark, inputs, "events", max_files).withWatermark("t", delay).dropDuplicates(["id", "t"])
                .select("id", F.unix_millis("t").alias("t")))
    if name == "join":
        left = _read(spark, inputs, "left", max_files).withWatermark("lt", delay)
        right = _read(spark, inputs, "right", max_files).withWatermark("rt", delay)
        return (left.join(right, F.expr("oid = roid AND rt >= lt AND rt <= lt + interval 40 seconds"))
                .select("oid", F.unix_millis("lt").alias("lt"), F.unix_millis("rt").alias("rt"), "amount"))
    raise ValueError(f"unknown query {name!r}; the soak runs {NAMES}")


class Outputs:
    """One file per batch id under ``root``: what the last run of each batch emitted (rows as JSON lists)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def write(self, batch: int, rows: list) -> None:
        tmp = self.root / f".b{batch:08d}.tmp"
        tmp.write_text("".join(json.dumps(list(r)) + "\n" for r in rows))
        tmp.replace(self.root / f"b{batch:08d}.jsonl")

    def batches(self) -> dict[int, list[tuple]]:
        out = {}
        for p in sorted(self.root.glob("b*.jsonl")):
            out[int(p.stem[1:])] = [tuple(json.loads(line)) for line in p.read_text().splitlines() if line]
        return out


class SoakQuery:
    """One query of the soak: started, stopped, restarted on failure, moved to a restored checkpoint.

    ``checkpoint`` changes when the query is restored from a savepoint (a new timeline); every
    checkpoint it ran on is kept in ``checkpoints``.
    """

    def __init__(self, name: str, spark: SparkSession, inputs: InputWriter, workdir: Path, *,
                 trigger: str, max_files: int, markers: Path):
        self.name, self.spark, self.inputs = name, spark, inputs
        self.trigger, self.max_files = trigger, max_files
        self.checkpoints = [Path(workdir, "ckpt", name, "c0")]
        self.outputs = Outputs(Path(workdir, "out", name))
        self.cfg = {"query": name, "fail": str(markers / "fail"), "attempts": str(markers / "attempts")}
        Path(self.cfg["attempts"]).mkdir(parents=True, exist_ok=True)
        self.handle = None
        self.last_batch_at = 0.0
        self.failures: list[dict] = []
        self._lock = threading.Lock()

    @property
    def checkpoint(self) -> Path:
        return self.checkpoints[-1]

    def _sink(self, batch: DataFrame, batch_id: int) -> None:
        self.outputs.write(batch_id, [tuple(r) for r in batch.collect()])
        self.last_batch_at = time.time()

    def _start(self, once: bool = False):
        df = build(self.name, self.spark, self.inputs, self.max_files)
        df = df.mapInPandas(functools.partial(after_commit, self.cfg), OUTPUT[self.name])
        writer = (df.writeStream.outputMode(MODES[self.name]).queryName(f"soak-{self.name}")
                  .option("checkpointLocation", str(self.checkpoint)).foreachBatch(self._sink))
        writer = writer.trigger(once=True) if once else writer.trigger(processingTime=self.trigger)
        return writer.start()

    def start(self) -> None:
        with self._lock:
            self.handle = self._start()

    def stop(self) -> None:
        """Stops the query (a running batch is interrupted: Spark re-runs it at the next start)."""
        with self._lock:
            if self.handle is not None:
                self.handle.stop()
                self.handle = None

    def stop_cleanly(self, timeout: float = 600) -> None:
        """Stops the query with its last batch committed (what rescale and savepoint need): stops it, and if that
        interrupted a batch, runs the query once more with a one-batch trigger, which finishes that batch."""
        from spark_state.spark.checkpoint import SparkCheckpoint

        self.stop()
        ckpt = SparkCheckpoint(str(self.checkpoint))
        if ckpt.last_batch == ckpt.last_committed:
            return
        with self._lock:
            run = self._start(once=True)
            try:
                if not run.awaitTermination(timeout):
                    raise TimeoutError(f"{self.name}: finishing batch {ckpt.last_batch} took over {timeout}s")
            finally:
                run.stop()

    def failed(self) -> str | None:
        """Spark's message if the query stopped with an error (it is then restarted by the caller)."""
        with self._lock:
            handle = self.handle
        if handle is None or handle.isActive:
            return None
        err = handle.exception()
        return str(err) if err is not None else "stopped without an error"

    def recent_progress(self) -> list[dict]:
        handle = self.handle   # no lock: the sampler must not wait while a fault stops this query
        if handle is None:
            return []
        try:
            return [p if isinstance(p, dict) else json.loads(p.json) for p in handle.recentProgress]
        except Exception:  # noqa: BLE001 - the query may be stopping under our feet; the next sample catches up
            return []


def wait_for(cond: Callable[[], bool], timeout: float, what: str, poll: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(poll)
