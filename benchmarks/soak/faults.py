"""The soak's fault schedule: seeded, in rounds, each round every kind once in a random order, at
random intervals; every fault is logged with its time, what it hit and whether the system recovered.

Kinds (``KINDS``):

* ``executor-kill``     SIGKILL an executor JVM (the standalone worker starts a new one);
* ``worker-kill``       SIGKILL a spark_state worker process (its shim starts a new one);
* ``commit-crash``      the worker dies inside a commit, after the data file or after the manifest
                        (fault points, spark_state/faults.py);
* ``compaction-crash``  the worker dies after writing a compacted snapshot, before its record;
* ``task-failure``      a task fails after its state commit (queries.after_commit), Spark retries it;
* ``speculation``       a commit stalls in the worker until Spark starts a speculative copy elsewhere;
* ``s3-burst``          the proxy fails or stalls a quarter of all S3 requests for a while;
* ``query-restart``     a query is stopped (mid-batch, as it happens) and started from its checkpoint;
* ``rescale``           a query is stopped and ``spark_state.rescale`` changes its partition count;
* ``savepoint-restore`` a query is stopped, saved, restored into a new checkpoint and resumes there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("executor-kill", "worker-kill", "commit-crash", "compaction-crash", "task-failure", "speculation",
         "s3-burst", "query-restart", "rescale", "savepoint-restore")
#: A commit stalled this long gets a speculative copy (tests/cluster/session.py: after 3 s).
SPECULATION_STALL_S = 12
BURST_RATE, BURST_S = 0.25, 20


@dataclass
class Event:
    """One fault as it happened: ``recovered_s`` is how long until every query committed a batch again."""

    t: float
    kind: str
    detail: str = ""
    ok: bool = True
    took_s: float = 0.0
    recovered_s: float | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class Schedule:
    """Which fault comes next and when: rounds of every kind in a seeded random order, exponential gaps."""

    seed: int
    mean_gap_s: float
    kinds: tuple[str, ...] = KINDS
    _rng: random.Random = field(init=False)
    #: kinds the first round starts with, in this order (the smoke puts the slow ones first, before a backlog)
    first: tuple[str, ...] = ()
    _round: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._rng = random.Random(f"{self.seed}-faults")
        unknown = set(self.first) - set(self.kinds)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; kinds are {', '.join(self.kinds)}")
        rest = [k for k in self.kinds if k not in self.first]
        self._rng.shuffle(rest)
        self._round = rest + list(reversed(self.first))   # popped from the end

    def gap(self) -> float:
        return min(self._rng.expovariate(1 / self.mean_gap_s), 3 * self.mean_gap_s)

    def next_kind(self) -> str:
        if not self._round:
            self._round = list(self.kinds)
            self._rng.shuffle(self._round)
        return self._round.pop()

    def choice(self, items):
        return self._rng.choice(list(items))


class Injector:
    """Performs faults on the running soak (``world``: cluster.World, ``queries``: name -> SoakQuery)."""

    def __init__(self, world, queries: dict, schedule: Schedule, markers: Path, base_rate: float, log_path: Path,
                 burst_s: float = BURST_S):
        self.world, self.queries, self.schedule = world, queries, schedule
        self.markers, self.base_rate = markers, base_rate
        self.log_path, self.burst_s = log_path, burst_s
        self.events: list[Event] = []
        self.burst_until = 0.0
        self._burst_lock = threading.Lock()   # the burst's timer thread and the soak's loop both end bursts
        self.partitions = {name: 2 for name in queries}

    # ----------------------------------------------------------------- bookkeeping

    def record(self, event: Event) -> None:
        self.events.append(event)
        with open(self.log_path, "a") as f:
            f.write(event.to_json() + "\n")

    def fire(self, kind: str) -> Event:
        started = time.time()
        event = Event(started, kind)
        try:
            event.detail = getattr(self, "_" + kind.replace("-", "_"))()
        except Exception as err:  # noqa: BLE001 - a fault that could not be performed is logged, not fatal
            event.ok, event.detail = False, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        event.took_s = round(time.time() - started, 2)
        self.record(event)
        return event

    def tick(self) -> None:
        """Ends an S3 burst whose time is up (also called from the burst's own timer: a fault that takes
        minutes, such as a rescale, must not keep a burst going for that long)."""
        with self._burst_lock:
            if self.burst_until and time.time() >= self.burst_until:
                self.world.proxy.set(self.base_rate)
                self.burst_until = 0.0

    def quiet(self) -> None:
        """No more S3 faults, no armed fault point left (the end checks read storage)."""
        with self._burst_lock:
            self.world.proxy.set(0.0)
            self.burst_until = 0.0
        for p in self.world.faults.armed():
            try:
                (self.world.faults.root / p).unlink()
            except FileNotFoundError:
                pass
        try:
            (self.markers / "fail").unlink()
        except FileNotFoundError:
            pass

    # ----------------------------------------------------------------- processes

    def _executor_kill(self) -> str:
        from tests.cluster.processes import executor_jvms
        from tests.support.processes import sigkill

        jvms = executor_jvms(self.world.spark)
        if len(jvms) < 2:
            raise RuntimeError(f"skipped: only {len(jvms)} executor JVM(s) up")
        victim = self.schedule.choice(jvms)
        sigkill(victim, "executor JVM")
        return f"executor JVM {victim}"

    def _worker_kill(self) -> str:
        from tests.cluster.processes import executor_jvms
        from tests.support.processes import worker_pids

        workers = [w for jvm in executor_jvms(self.world.spark) for w in worker_pids(jvm)]
        if not workers:
            raise RuntimeError("skipped: no spark_state worker running")
        victim = self.schedule.choice(workers)
        os.kill(victim, signal.SIGKILL)
        return f"spark_state worker {victim}"

    def _commit_crash(self) -> str:
        point = self.schedule.choice(("commit-after-data", "commit-after-manifest"))
        self._arm(point, "exit")
        return point

    def _compaction_crash(self) -> str:
        self._arm("compaction-after-snapshot", "exit")
        return "compaction-after-snapshot"

    def _speculation(self) -> str:
        self._arm("commit-after-data", f"sleep:{SPECULATION_STALL_S}")
        return f"commit-after-data sleep:{SPECULATION_STALL_S}"

    def _arm(self, point: str, action: str) -> None:
        if point in self.world.faults.armed():
            raise RuntimeError(f"skipped: {point} still armed from an earlier fault")
        self.world.faults.arm(point, action)

    def _task_failure(self) -> str:
        marker = self.markers / "fail"
        if marker.exists():
            raise RuntimeError("skipped: the previous task failure was not claimed yet")
        marker.touch()
        return "the next task to end after its commit fails"

    def _s3_burst(self) -> str:
        with self._burst_lock:
            self.world.proxy.set(BURST_RATE)
            self.burst_until = time.time() + self.burst_s
        timer = threading.Timer(self.burst_s + 0.1, self.tick)
        timer.daemon = True
        timer.start()
        return f"{BURST_RATE:.0%} of S3 requests fail or stall for {self.burst_s:g}s"

    # ----------------------------------------------------------------- queries

    def _query_restart(self) -> str:
        name = self.schedule.choice(self.queries)
        q = self.queries[name]
        q.stop()
        q.start()
        return name

    def _rescale(self) -> str:
        import spark_state

        name = self.schedule.choice(self.queries)
        q = self.queries[name]
        new = 3 if self.partitions[name] == 2 else 2
        clock = _Clock()
        q.stop_cleanly()
        clock.lap("stop")
        try:
            _retrying(lambda: spark_state.rescale(str(q.checkpoint), new, options=self.world.tool_options))
            clock.lap("rescale")
            self.partitions[name] = new
        finally:
            q.start()
        return f"{name} to {new} partitions ({clock})"

    def _savepoint_restore(self) -> str:
        import spark_state

        name = self.schedule.choice(self.queries)
        q = self.queries[name]
        clock = _Clock()
        q.stop_cleanly()
        clock.lap("stop")
        target = q.checkpoint.parent / f"c{len(q.checkpoints)}"
        try:
            url = _retrying(lambda: spark_state.savepoint(str(q.checkpoint), f"{self.world.savepoints}/{name}",
                                                          options=self.world.tool_options))
            clock.lap("savepoint")
            _retrying(lambda: spark_state.restore(url, str(target), options=self.world.tool_options),
                      cleanup=lambda: _rm_tree(target))
            clock.lap("restore")
            q.checkpoints.append(target)
        finally:
            q.start()
        return f"{name}: {url} -> {target.name} ({clock})"


class _Clock:
    """Laps of a fault that takes a while (stopping a query cleanly, a tool), for its log line."""

    def __init__(self):
        self._last, self._laps = time.monotonic(), []

    def lap(self, what: str) -> None:
        now = time.monotonic()
        self._laps.append(f"{what} {now - self._last:.0f}s")
        self._last = now

    def __str__(self) -> str:
        return ", ".join(self._laps)


def _retrying(action, attempts: int = 3, cleanup=None):
    """Runs an offline tool again when storage failed it (they are safe to re-run: docs/operating.md)."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception:
            if attempt == attempts:
                raise
            if cleanup is not None:
                cleanup()
            time.sleep(2)


def _rm_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
