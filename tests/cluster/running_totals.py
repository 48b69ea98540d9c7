"""The query every cluster test runs: a per-key running total (applyInPandasWithState).

Its output is checked against totals computed from the input, batch by batch:
batch ``b`` reads input file ``b`` and emits ``(k, total, n)`` for every key in
it, the sum and count of all of that key's values up to and including batch
``b``. A lost, stale or doubled state row changes some total, so every test
can fail on any state defect.

The UDF also records where each task attempt ran (batch, partition, attempt,
executor JVM) and can be told to stall (so a test can kill an executor in the
middle of a batch); a downstream ``mapInPandas`` can fail a task attempt after
the state commit (so Spark retries it, on the other executor).
"""

from __future__ import annotations

import functools
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from pyspark.sql import DataFrame, SparkSession

from tests.cluster.processes import Beside
from tests.support.spark import JsonStream, Query, QueryFailed, sort_rows

SCHEMA = "k string, v long"
OUTPUT_SCHEMA = "k string, total long, n long"
STATE_SCHEMA = "total long, n long"

#: Every cluster query retains and compacts aggressively: maintenance runs every second
#: (session conf), a snapshot every 2 deltas, 2 batches retained, unreferenced files deleted at once.
CLUSTER_OPTIONS = {"storage": "filesystem", "snapshot_interval": 2, "file_grace_period": "0"}
CLUSTER_CONF = {"spark.sql.streaming.minBatchesToRetain": "2"}


def supported(options: dict) -> dict:
    """``options`` without those the spark_state under test does not know yet.

    Only ``file_grace_period`` (issue 9) may be missing; code without it deletes
    unreferenced files at once, which is what ``0`` asks for.
    """
    from spark_state.spark.config import KEYWORDS

    unknown = set(options) - set(KEYWORDS)
    if unknown - {"file_grace_period"}:
        raise TypeError(f"unknown spark_state option(s) {sorted(unknown)}")
    return {k: v for k, v in options.items() if k in KEYWORDS}


def brief(message: str, limit: int = 6) -> str:
    """Spark's first line and the lines that say what went wrong (spark_state's, the UDF's), not the traces."""
    lines = message.splitlines()
    keep = [lines[0][:400]] if lines else []
    for line in lines[1:]:
        line = line.strip()
        if ("spark_state:" in line or "Error:" in line or "Exception:" in line or "Lost task" in line) \
                and not line.startswith("at ") and line[:400] not in keep:
            keep.append(line[:400])
        if len(keep) > limit:
            break
    return "\n".join(keep)


# ------------------------------------------------------------- code run in the executors

def _executor_pid() -> int:
    """The executor JVM this Python worker runs under (0 outside a cluster)."""
    pid = os.getpid()
    for _ in range(8):
        try:
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            return 0
    return 0


def _task() -> tuple[int, int, int, int]:
    """(batch id, partition, stage id, attempt number) of the running task."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    return int(tc.getLocalProperty("streaming.sql.batchId")), tc.partitionId(), tc.stageId(), tc.attemptNumber()


#: Groups each task attempt of this Python process has seen (fail_mid_batches).
_GROUPS: dict[tuple[int, int, int], int] = {}


def tally(cfg: dict, key, pdfs, state):
    """Running total per key; notes where the task runs; stalls once if the stall marker exists."""
    import pandas as pd

    (k,) = key
    total, n = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        total += int(pdf["v"].sum())
        n += len(pdf)
    state.update((total, n))
    batch, partition, stage, attempt = _task()
    if attempt == 0 and batch in cfg["fail_mid_batches"]:
        _GROUPS[(batch, partition, stage)] = seen = _GROUPS.get((batch, partition, stage), 0) + 1
        if seen == 5:   # the state of four groups is in the store (and streamed to the worker) by now
            raise RuntimeError(f"injected failure in the middle of a batch (batch {batch}, partition {partition})")
    executor = _executor_pid()
    Path(cfg["record"], f"b{batch}-p{partition}-s{stage}-a{attempt}-x{executor}").touch()
    _maybe_stall(cfg, executor)
    yield pd.DataFrame({"k": [k], "total": [total], "n": [n]})


def _maybe_stall(cfg: dict, executor: int) -> None:
    marker = cfg["stall"]
    try:
        os.rename(marker, f"{marker}.taken-{os.getpid()}")   # exactly one task claims it
    except FileNotFoundError:
        return
    tmp = f"{marker}.at.tmp-{os.getpid()}"
    Path(tmp).write_text(str(executor))
    os.rename(tmp, f"{marker}.at")
    deadline = time.monotonic() + cfg["stall_seconds"]
    while time.monotonic() < deadline:
        time.sleep(0.05)


def fail_first_attempt(cfg: dict, batches: Iterator) -> Iterator:
    """Passes every row on, then fails attempt 0 of the batches in ``cfg["fail_batches"]``.

    It sits after the stateful operator in the same task, so it sees the end of
    its input only after the state store committed: the failure comes after the
    commit, and Spark's retry re-commits the same version elsewhere.
    """
    yield from batches
    batch, partition, _, attempt = _task()
    if attempt == 0 and batch in cfg["fail_batches"]:
        raise RuntimeError(f"injected failure after the state commit (batch {batch}, partition {partition})")


# ------------------------------------------------------------- the test side

@dataclass(frozen=True)
class Attempt:
    """A task attempt of the stateful stage; stage ids grow, so a re-run batch sorts after its first run."""

    batch: int
    partition: int
    stage: int
    attempt: int
    executor: int


class RunningTotals:
    """One running-total query on the cluster: input, query, oracle and task placements.

    ``add(n)`` writes ``n`` input files (one micro-batch each); ``run()`` runs the
    query over all available input and stops it (a restart from the checkpoint
    each time, see tests.support.spark.Query).
    """

    def __init__(self, spark: SparkSession, workdir: Path, *, seed: int, checkpoint: Path | None = None,
                 options: dict | None = None, conf: dict | None = None, fail_batches=(), fail_mid_batches=(),
                 keys: int = 24, rows: int = 16, timeout: float = 150):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.events = JsonStream(self.workdir / "events", SCHEMA)
        self.record = self.workdir / "tasks"
        self.record.mkdir(exist_ok=True)
        self.stall_marker = self.workdir / "stall"
        self.cfg = {"record": str(self.record), "stall": str(self.stall_marker), "stall_seconds": 60.0,
                    "fail_batches": sorted(fail_batches), "fail_mid_batches": sorted(fail_mid_batches)}
        self.inputs: list[list[dict]] = []
        self.rng = random.Random(seed)
        self.keys, self.rows = keys, rows
        self.options = supported({**CLUSTER_OPTIONS, **(options or {})})
        self.query = Query(spark, self.build, checkpoint or self.workdir / "ckpt", mode="update",
                           provider="spark_state", options=self.options, conf={**CLUSTER_CONF, **(conf or {})},
                           timeout=timeout)

    @property
    def checkpoint(self) -> Path:
        return self.query.checkpoint

    def build(self, spark: SparkSession) -> DataFrame:
        from pyspark.sql.streaming.state import GroupStateTimeout

        df = self.events.read(spark).groupBy("k").applyInPandasWithState(
            functools.partial(tally, self.cfg), OUTPUT_SCHEMA, STATE_SCHEMA, "update", GroupStateTimeout.NoTimeout)
        if self.cfg["fail_batches"]:
            df = df.mapInPandas(functools.partial(fail_first_attempt, self.cfg), OUTPUT_SCHEMA)
        return df

    # ---------------------------------------------------------------- input

    def add(self, files: int = 1) -> None:
        """Adds ``files`` input files of random keys and values (one micro-batch each)."""
        for _ in range(files):
            rows = [{"k": f"k{self.rng.randrange(self.keys):02d}", "v": self.rng.randrange(1, 1000)}
                    for _ in range(self.rows)]
            self.inputs.append(rows)
            self.events.add(rows)

    def run(self) -> list[int]:
        """Runs the query over all input available now, then stops it; a failure says why in brief."""
        try:
            return self.query.run()
        except QueryFailed as err:
            raise QueryFailed(brief(err.message)) from None

    def run_beside(self, batches: int, on_batch: Callable[[int], None], action: Callable):
        """Adds ``batches`` files and runs them, calling ``on_batch(batch)`` in the driver after each batch, while
        ``action(done)`` runs in a thread (processes.Beside); returns what the action returned."""
        self.query.on_batch = on_batch
        self.add(batches)
        beside = Beside(action)
        try:
            self.run()
        finally:
            result = beside.join()
        return result

    # ---------------------------------------------------------------- oracle

    def expected(self) -> dict[int, list]:
        """batch -> the rows it must emit, computed from the input alone."""
        totals: dict[str, tuple[int, int]] = {}
        out = {}
        for batch, rows in enumerate(self.inputs):
            for row in rows:
                total, n = totals.get(row["k"], (0, 0))
                totals[row["k"]] = (total + row["v"], n + 1)
            out[batch] = sort_rows((k, *totals[k]) for k in {r["k"] for r in rows})
        return out

    def totals(self, batches: int | None = None) -> dict[str, tuple[int, int]]:
        """key -> (total, n) after the first ``batches`` batches (all by default)."""
        totals: dict[str, tuple[int, int]] = {}
        for rows in self.inputs[:batches]:
            for row in rows:
                total, n = totals.get(row["k"], (0, 0))
                totals[row["k"]] = (total + row["v"], n + 1)
        return totals

    def assert_exact(self) -> None:
        """Every batch so far emitted exactly the totals of the input."""
        expected, got = self.expected(), self.query.outputs
        wrong = [b for b in sorted(set(expected) | set(got)) if expected.get(b) != got.get(b)]
        if wrong:
            b = wrong[0]
            exp, out = dict((r[0], r[1:]) for r in expected.get(b, [])), dict((r[0], r[1:]) for r in got.get(b, []))
            diff = {k: (exp.get(k), out.get(k)) for k in sorted(set(exp) | set(out)) if exp.get(k) != out.get(k)}
            raise AssertionError(f"batches {wrong} differ from the totals of the input; batch {b} "
                                 f"(key: (expected total, n), (got total, n)): {diff}")

    # ---------------------------------------------------------------- placement

    def attempts(self) -> list[Attempt]:
        """Every task attempt of the stateful stage that ran (from the UDF's notes)."""
        out = []
        for p in self.record.iterdir():
            b, part, s, a, x = p.name.split("-")
            out.append(Attempt(int(b[1:]), int(part[1:]), int(s[1:]), int(a[1:]), int(x[1:])))
        return sorted(out, key=lambda t: (t.batch, t.partition, t.stage, t.attempt))

    def ran_on(self, batch: int, partition: int) -> list[int]:
        """Executors that ran (batch, partition), in the order the attempts started (repeats kept)."""
        return [t.executor for t in self.attempts() if (t.batch, t.partition) == (batch, partition)]

    # ---------------------------------------------------------------- stalls

    def stall_next_task(self) -> None:
        """The next task that runs the UDF stalls (up to 60 s, or until killed).

        ``<stall>.at`` then holds the pid of the executor JVM it stalls in.
        """
        for p in self.workdir.glob("stall.*"):
            p.unlink()
        self.stall_marker.touch()
