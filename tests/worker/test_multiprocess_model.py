"""Several worker processes on one store, checked against a dict model of what was acknowledged (issue 9).

(Over 400 lines on purpose: one Hypothesis state machine, its rules and the model they check; split, each rule
would be read away from the invariants it must keep.)

Spark runs one task per store at a time, but tasks move between executors, retries and speculative
copies re-commit a version, an old executor's maintenance runs while a new one commits, and workers
and executors die mid-request. Each simulated executor here is a shim's view (the version it holds,
with its commit id) plus a real ``python -m spark_state.worker`` process spoken to over its real
socket. Hypothesis interleaves what Spark can do to one store (operator 0, partition 0) across three
of them, on file:// and on a loopback S3 server (moto), and checks every reply, every load and the
storage itself against the model: each acknowledged version's content and commit id, and the oldest
version that the maintenance requests sent so far allow retention to delete (``floor``).

Maintenance runs in the worker's background thread, so it really overlaps later steps. The
``wait_for_maintenance`` step is a barrier built from the protocol alone: the worker runs
maintenance on one FIFO thread, so once a maintenance queued on a private store of that worker has
visibly deleted a version, everything queued before it has finished.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import re
import select
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from spark_state.errors import VersionNotFound
from spark_state.format.manifest import CompactionRecord, Manifest
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.layout import file_version
from spark_state.worker.protocol import ipc_to_table, table_to_ipc
from tests.support import s3_server
from tests.support.changes import M, KEYS as HASHED_KEYS, as_dict, changes
from tests.support.worker_client import Worker, WorkerGone

EXECUTORS = 3
RESTARTS_PER_EXAMPLE = 3
PAUSE = {"file": 0.1, "s3": 0.6}   # seconds a commit is held between its data file and its manifest while another
                                  # executor works (long enough for that work to overlap it)
KEYS = HASHED_KEYS[:8]   # k5, k6 collide
QUERY_ID = "5f1e0c1a-0000-4000-8000-00000000a11d"
executors = st.integers(0, EXECUTORS - 1)
change_sets = st.dictionaries(st.sampled_from(KEYS), st.booleans(), max_size=3)   # key -> put (True) / delete


def when(condition):
    """A precondition on what the workers did, checked inside the rule: the step does nothing when false.

    Hypothesis's own ``precondition`` decides which rules it may draw, so it must answer the same each
    time an example is replayed; a background deletion racing a load can change what the workers did
    between replays (FlakyStrategyDefinition in CI, stop 45). A rule's arguments are drawn before its
    body runs, so checking here keeps every replay's draws equal. Conditions on the model's own
    counters (restarts, grace) stay Hypothesis preconditions: they do not depend on timing.
    """
    def decorate(step):
        @functools.wraps(step)
        def guarded(self, **kwargs):
            if not condition(self):
                self.events[f"{step.__name__}: not applicable"] += 1
                return None
            return step(self, **kwargs)
        return guarded
    return decorate


_LISTED = re.compile(r"^(?:chk-(\d+)/(_metadata|_snapshot)|(shared/[^/]+))$")


def encode(delta: dict[bytes, bytes | None]) -> bytes:
    return table_to_ipc(changes(delta)).to_pybytes()


def decode(body: bytes) -> dict[bytes, bytes]:
    return as_dict(ipc_to_table(body))


def applied(state: dict, delta: dict) -> dict:
    out = dict(state)
    for k, x in delta.items():
        if x is None:
            out.pop(k, None)
        else:
            out[k] = x
    return out


@dataclass
class Version:
    """An acknowledged version: its content, and the commit ids storage may hold for it
    (one once known; two after speculative duplicates; empty when written but never seen)."""

    content: dict
    ids: frozenset


@dataclass
class View:
    """What a shim holds: the version of its live map, that version's commit id, the map."""

    version: int
    commit_id: str | None
    content: dict


@dataclass
class Executor:
    """A simulated executor: its shim (view, and the version it last loaded or committed, which its
    maintenance retains around) and its real worker process."""

    worker: Worker
    conn: object = None
    view: View | None = None
    held: int = 0
    barrier_ids: dict = field(default_factory=dict)   # private barrier store: version -> commit id


class Backend:
    """Where the examples' stores live: a fresh base URL per example, and a test-side view of storage.

    The barrier stores (see ``StoreModel.barrier``) live on the local disk whatever the backend: they
    only show when a worker's maintenance queue has drained, and on S3 they would cost most of the run.
    """

    def __init__(self, kind: str, tmp: Path, s3_endpoint: str):
        self.kind = kind
        self.local = f"file://{tmp}"
        self.s3_options = {}
        if kind == "file":
            self.prefix = self.local
        else:
            import boto3

            bucket = f"model-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
            self.prefix = f"s3://{bucket}"
            self.s3_options = {"endpoint_url": s3_endpoint}
        self._count = itertools.count()

    def new_base(self) -> tuple[str, str]:
        """(base URL of the example's store, base URL of its barrier stores)."""
        n = next(self._count)
        return f"{self.prefix}/ex{n}", f"{self.local}/barrier{n}"

    def storage(self, root: str) -> FileSystemCheckpointStorage:
        """spark_state's own storage class, with no listing cached from an earlier look."""
        options = self.s3_options if root.startswith("s3://") else {}
        storage = FileSystemCheckpointStorage(root, use_listings_cache=False, **options)
        storage.fs.invalidate_cache()
        return storage


class StoreModel(RuleBasedStateMachine):
    """One store, three executors, the model of what was acknowledged (see the module docstring)."""

    backend: Backend
    workers: list[Worker]
    grace: str | None = "0"          # fileGracePeriod; None = the default (nothing is old enough to delete)
    fsync = False
    steps_run = 0
    examples_run = 0
    events: collections.Counter   # what the runs exercised, printed at the end (a model that never
                                  # sees a StaleState or a crash proves little)

    def __init__(self):
        super().__init__()
        type(self).examples_run += 1
        self.base, self.barrier_base = self.backend.new_base()
        self.ex = [Executor(w) for w in self.workers]
        self.versions: dict[int, Version] = {0: Version({}, frozenset([None]))}
        self.floor = 0        # versions >= floor survive every maintenance requested so far
        self.counter = 0
        self.steps = 0
        self.restarts_left = RESTARTS_PER_EXAMPLE   # a worker start costs ~0.5 s of CPU: a few per example
        self.keep = 2   # minBatchesToRetain (one value per query, as in Spark); drawn by choose_retention
        self._manifest_cache: dict[tuple[int, str], tuple[bytes, Manifest]] = {}
        self._record_cache: dict[tuple[int, str], object] = {}

    # ------------------------------------------------------------------ requests

    def options(self) -> dict:
        opts = {"storage": "filesystem", "maxParallelism": str(M), "snapshotInterval": "2"}
        if self.grace is not None:
            opts["fileGracePeriod"] = self.grace
        if not self.fsync:
            opts["fsync"] = "false"   # only a kernel crash needs it; the runs with the default grace keep it on
        return opts

    def store(self, partition: int = 0) -> dict:
        base = self.base if partition < 100 else self.barrier_base
        return {"sparkRoot": f"{base}/state", "location": f"{base}/state/0/{partition}",
                "operator": 0, "partition": partition, "name": "default", "queryId": QUERY_ID}

    def root(self, partition: int = 0) -> str:
        return f"{self.base if partition < 100 else self.barrier_base}/state/0/{partition}"

    def header(self, op: str, partition: int = 0, **fields) -> dict:
        options = self.options()
        if partition >= 100:   # a barrier store: retention only, nothing to compact
            options["snapshotInterval"] = "1000000"
        return {"op": op, "store": self.store(partition), "options": options, **fields}

    def connection(self, ex: Executor):
        if ex.conn is None:
            ex.conn = ex.worker.connect()
        return ex.conn

    def call(self, ex: Executor, header: dict, body: bytes = b"") -> tuple[dict, bytes]:
        try:
            return self.connection(ex).request(header, body)
        except WorkerGone:
            pytest.fail(f"worker {ex.worker.pid} died on {header['op']}; log tail:\n{ex.worker.log_tail()}")

    def restart(self, ex: Executor) -> None:
        self.restarts_left -= 1
        if ex.conn is not None:
            ex.conn.close()
        ex.conn = None
        ex.worker.restart()

    @property
    def head(self) -> int:
        return max(self.versions)

    # ------------------------------------------------------------------ the model's expectations

    def expect_commit(self, view: View) -> str:
        """'ok', 'stale' (StaleState) or 'either' (the base may be gone: below the floor, or two ids possible)."""
        if view.version == 0:
            return "ok"
        if view.version < self.floor:
            return "either"
        ids = self.versions[view.version].ids
        if view.commit_id in ids:
            return "ok" if len(ids) == 1 else "either"
        return "stale"

    def raise_floor(self, low: int) -> None:
        self.floor = max(self.floor, low)

    # ------------------------------------------------------------------ load and commit

    def do_load(self, e: int, version: int) -> bool:
        """getStore(version) on executor e: the shim sends its commit id when it holds that version."""
        ex = self.ex[e]
        header = self.header("load", version=version)
        if ex.view is not None and ex.view.version == version and version > 0:
            header["commitId"] = ex.view.commit_id
        resp, body = self.call(ex, header)
        expected = self.versions[version]
        if not resp["ok"]:
            assert version < self.floor and resp["kind"] == "VersionNotFound", \
                f"load of version {version} (floor {self.floor}) failed: {resp}"
            self.events["load: below the floor, deleted"] += 1
            ex.view = None
            return False
        if resp.get("unchanged"):
            assert "commitId" in header, f"'unchanged' reply to a load that sent no commit id: {resp}"
            assert not expected.ids or header["commitId"] in expected.ids, \
                f"version {version}: worker says {header['commitId']} is current, model has {set(expected.ids)}"
            assert ex.view.content == expected.content
            commit_id, content = header["commitId"], ex.view.content
            self.events["load: unchanged"] += 1
        else:
            content = decode(body)
            assert resp["rows"] == len(content)
            assert content == expected.content, \
                f"version {version} loads as {content}, acknowledged {expected.content}"
            commit_id = resp.get("commitId")
            assert (commit_id is None) == (version == 0), resp
            assert not expected.ids or commit_id in expected.ids, \
                f"version {version} has commit id {commit_id}, acknowledged {set(expected.ids)}"
            assert "commitId" not in header or header["commitId"] != commit_id, \
                f"version {version} still has the commit id the shim sent, yet the reply is not 'unchanged'"
            self.events["load: reloaded" if "commitId" in header else "load"] += 1
        expected.ids = frozenset([commit_id])
        ex.view = View(version, commit_id, content)
        ex.held = version
        return True

    def ensure_view(self, e: int, version: int) -> bool:
        """Executor e holds `version` as storage has it now (a task's getStore); False if it is gone."""
        return self.do_load(e, version)

    def delta(self, changes: dict) -> dict:
        self.counter += 1
        return {k: (b"v%d" % self.counter) if put else None for k, put in sorted(changes.items())}

    def commit_request(self, view: View, delta: dict) -> tuple[dict, bytes]:
        return (self.header("commit", version=view.version + 1, baseCommitId=view.commit_id,
                            minVersionsToRetain=self.keep), encode(delta))

    def settle_commit(self, e: int, view: View, delta: dict, expect: str, resp: dict) -> None:
        ex = self.ex[e]
        version = view.version + 1
        self.events[f"commit ({expect} expected): {'ok' if resp['ok'] else resp['kind']}"] += 1
        if resp["ok"]:
            assert expect != "stale", \
                f"commit of version {version} on a stale base (commit id {view.commit_id}) was acknowledged"
            commit_id = resp.get("commitId")
            assert commit_id, resp
            content = applied(view.content, delta)
            if expect == "either" and view.version in self.versions:
                self.versions[view.version].ids = frozenset([view.commit_id])
            self.versions[version] = Version(content, frozenset([commit_id]))
            ex.view = View(version, commit_id, content)
            ex.held = version
        else:
            allowed = {"ok": (), "stale": ("StaleState",), "either": ("StaleState", "VersionNotFound")}[expect]
            assert resp["kind"] in allowed, f"commit of version {version} ({expect} expected) failed: {resp}"
            ex.view = None   # the shim drops its map; Spark's retry reloads

    def do_commit(self, e: int, changes: dict) -> None:
        ex = self.ex[e]
        view = ex.view
        if self.grace == "0" and view.version < self.floor:
            # With no grace period, nothing protects a commit on a base retention may be deleting right now.
            if not self.ensure_view(e, self.head):
                return
            view = ex.view
        expect = self.expect_commit(view)
        delta = self.delta(changes)
        header, body = self.commit_request(view, delta)
        resp, _ = self.call(ex, header, body)
        self.settle_commit(e, view, delta, expect, resp)

    # ------------------------------------------------------------------ rules: what Spark does

    @initialize(keep=st.integers(1, 4))
    def choose_retention(self, keep):
        """spark.sql.streaming.minBatchesToRetain of this query (the worker keeps at least 2)."""
        self.keep = keep

    @rule(e=executors, back=st.integers(0, 5))
    def load(self, e, back):
        """getStore / getReadStore of a recent version (tasks moving, restarts, rollbacks)."""
        self.do_load(e, max(0, self.head - back))

    @rule(e=executors, changes=change_sets)
    @when(lambda self: any(ex.view is not None for ex in self.ex))
    def commit(self, e, changes):
        """The next batch on whatever the executor holds: the head, an old version, or a stale one."""
        if self.ex[e].view is None:
            e = next(i for i, ex in enumerate(self.ex) if ex.view is not None)
        self.do_commit(e, changes)

    @rule(e=executors, changes=change_sets)
    def commit_next(self, e, changes):
        """Batch head+1 on executor e (it loads or confirms the head first)."""
        if self.ensure_view(e, self.head):
            self.do_commit(e, changes)

    @rule(e=executors, changes=change_sets)
    @when(lambda self: max(self.versions) >= 1)
    def recommit(self, e, changes):
        """A retry re-runs the last batch (sink failed after the state commit), maybe on another executor."""
        if self.ensure_view(e, self.head - 1):
            self.do_commit(e, changes)

    @rule(e=executors, back=st.integers(0, 2))
    def abort(self, e, back):
        """A task's abort after its commit was sent: drops what that commit may have left behind."""
        resp, _ = self.call(self.ex[e], self.header("abort", version=max(1, self.head + 1 - back)))
        assert resp["ok"], resp

    @rule(e=executors, background=st.booleans())
    @when(lambda self: any(ex.held for ex in self.ex))
    def maintenance(self, e, background):
        """doMaintenance on executor e around the version it holds; compaction and retention run in the
        worker's background thread (background=False waits for them)."""
        e = self.send_maintenance(e)
        if not background:
            self.barrier(e)

    @rule(e=executors)
    def wait_for_maintenance(self, e):
        """Lets executor e's background maintenance finish (so a counterexample replays the same way)."""
        self.barrier(e)

    @precondition(lambda self: self.restarts_left > 0)
    @rule(e=executors, executor_dies=st.booleans())
    def kill(self, e, executor_dies):
        """SIGKILL of the worker (the shim starts a new one, keeps its map) or of the whole executor."""
        self.restart(self.ex[e])
        self.events["executor killed" if executor_dies else "worker killed"] += 1
        if executor_dies:
            self.ex[e].view, self.ex[e].held = None, 0

    # ------------------------------------------------------------------ rules: crashes and overlaps (fault points)

    def commit_target(self, e: int, recommit: bool) -> View | None:
        """Executor e holds the head (next batch) or the version before it (a retried batch), fresh from storage."""
        target = self.head - 1 if recommit and self.head >= 1 else self.head
        return self.ex[e].view if self.ensure_view(e, target) else None

    @precondition(lambda self: self.restarts_left > 0)
    @rule(e=executors, changes=change_sets, recommit=st.booleans(),
          point=st.sampled_from(["commit-after-data", "commit-after-manifest"]), retry=st.booleans())
    def crash_in_commit(self, e, changes, recommit, point, retry):
        """The worker dies inside a commit; the shim retries once on a new worker, or the executor died too."""
        view = self.commit_target(e, recommit)
        if view is None:
            return
        ex = self.ex[e]
        delta = self.delta(changes)
        header, body = self.commit_request(view, delta)
        self.arm(ex, point, "exit")
        try:
            resp, _ = self.connection(ex).request(header, body)
        except WorkerGone:
            resp = None
        self.restart(ex)
        assert resp is None, f"the worker answered {resp} instead of dying at {point}"
        self.events[f"crash at {point}, {'retried' if retry else 'executor lost'}"] += 1
        if retry:
            resp, _ = self.call(ex, header, body)
            self.settle_commit(e, view, delta, "ok", resp)
            return
        ex.view, ex.held = None, 0
        if point == "commit-after-manifest":   # durable, though nobody saw its commit id
            self.versions[view.version + 1] = Version(applied(view.content, delta), frozenset())

    @rule(e=executors, other=executors, changes=change_sets, recommit=st.booleans(),
          meanwhile=st.sampled_from(["maintenance", "abort", "duplicate"]))
    @when(lambda self: max(self.versions) >= 1)
    def commit_while_another_works(self, e, other, changes, recommit, meanwhile):
        """A commit held between its data file and its manifest while another executor runs maintenance,
        aborts that version, or commits it too (a speculative copy with the same changes)."""
        q = other if other != e else (e + 1) % EXECUTORS
        view = self.commit_target(e, recommit)
        if view is None:
            return
        if meanwhile == "duplicate":
            if not self.ensure_view(q, view.version):
                return
        elif not self.ex[q].held and not self.ensure_view(q, self.head):   # maintenance on q itself
            return
        ex, other_ex = self.ex[e], self.ex[q]
        delta = self.delta(changes)
        header, body = self.commit_request(view, delta)
        self.arm(ex, "commit-after-data", f"sleep:{PAUSE[self.backend.kind]}")
        self.connection(ex).send(header, body)
        self.wait_fired(ex, "commit-after-data")
        duplicate = None
        if meanwhile == "maintenance":
            self.barrier(self.send_maintenance(q))
        elif meanwhile == "abort":
            resp, _ = self.call(other_ex, self.header("abort", version=view.version + 1))
            assert resp["ok"], resp
        else:
            qview = other_ex.view
            resp, _ = self.call(other_ex, *self.commit_request(qview, delta))
            assert resp["ok"], f"speculative copy of the commit of version {view.version + 1} failed: {resp}"
            duplicate = resp["commitId"]
        held = not select.select([ex.conn.sock], [], [], 0)[0]
        self.events[f"commit held while another executor: {meanwhile}, {'overlapped' if held else 'too slow'}"] += 1
        try:
            resp, _ = ex.conn.receive()
        except WorkerGone:
            pytest.fail(f"worker died in a held commit; log tail:\n{ex.worker.log_tail()}")
        self.settle_commit(e, view, delta, "ok", resp)
        if duplicate is not None:   # whichever manifest landed last is the version; both have the same content
            version = self.versions[view.version + 1]
            version.ids = version.ids | {duplicate}
            other_ex.view = View(view.version + 1, duplicate, version.content)

    @precondition(lambda self: self.restarts_left > 0)
    @rule(e=executors)
    @when(lambda self: any(ex.held for ex in self.ex))
    def crash_in_compaction(self, e):
        """The worker dies between writing a compacted snapshot and recording it (if it compacts at all)."""
        e = self.holder(e)
        # compactions earlier commits queued finish first: whether the armed crash fires must not depend on timing
        resp, _ = self.call(self.ex[e], {"op": "drain", "timeoutMs": 60_000})
        assert resp == {"ok": True, "pending": 0}, resp
        self.arm(self.ex[e], "compaction-after-snapshot", "exit")
        sent = self.send_maintenance(e, may_die=True)
        alive = sent is not None and self.barrier(sent)
        self.events["crash in compaction" if not alive else "crash in compaction armed, no compaction"] += 1
        self.disarm(self.ex[e])

    @precondition(lambda self: self.grace == "0")
    @rule(e=executors)
    @when(lambda self: max(self.versions) >= 1)
    def collect_garbage(self, e):
        """Once nothing runs, one maintenance at the head leaves no unreferenced file below the window:
        crashed commits, aborted attempts, superseded compactions and replaced deltas are all collected."""
        for i in range(EXECUTORS):
            self.barrier(i)
        if not self.ensure_view(e, self.head):
            return
        oldest = self.head - max(self.keep, 2) + 1
        self.barrier(self.send_maintenance(e))
        storage = self.backend.storage(self.root())
        stamps, records, files = self.list_store(storage)
        referenced = set()
        for _, manifest in self._read_manifests(storage, stamps).values():
            referenced.update(manifest.paths)
        for v, stamp in records.items():
            data = storage.read_record(v, "_snapshot")
            if data is not None:
                referenced.add(CompactionRecord.from_json(data, f"chk-{v}/_snapshot").snapshot.path)
        leaked = sorted(f for f in files - referenced if (file_version(f) or 0) < oldest)
        assert not leaked, f"retention around version {self.head} left unreferenced files {leaked}"
        self.events["garbage collected"] += 1

    def faults(self, ex: Executor) -> Path:
        return Path(ex.worker.env["SPARK_STATE_FAULT_DIR"])

    def arm(self, ex: Executor, point: str, action: str) -> None:
        self.disarm(ex)
        tmp = self.faults(ex) / f".{point}.tmp"
        tmp.write_text(action)
        os.replace(tmp, self.faults(ex) / point)   # the worker must never claim a half-written file

    def disarm(self, ex: Executor) -> None:
        for f in self.faults(ex).iterdir():
            f.unlink(missing_ok=True)

    def wait_fired(self, ex: Executor, point: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(self.faults(ex).glob(f"{point}.fired-*")):
            assert ex.worker.alive() and time.monotonic() < deadline, \
                f"fault point {point} not reached; log tail:\n{ex.worker.log_tail()}"
            time.sleep(0.002)

    # ------------------------------------------------------------------ maintenance and its barrier

    def holder(self, e: int) -> int:
        """e, or the first executor that holds a version (a shim that holds none sends no maintenance)."""
        return e if self.ex[e].held else next(i for i, ex in enumerate(self.ex) if ex.held)

    def send_maintenance(self, e: int, *, may_die: bool = False) -> int | None:
        """Maintenance on (a holder near) e; retention may from now on delete what is below its window.

        With `may_die` (a compaction crash is armed) the worker may exit before it answers: its
        background thread can reach the fault point first. Returns None then (the worker is replaced).
        """
        e = self.holder(e)
        ex = self.ex[e]
        self.raise_floor(ex.held - max(self.keep, 2) + 1)
        header = self.header("maintenance", minVersionsToRetain=self.keep, version=ex.held)
        if not may_die:
            resp, _ = self.call(ex, header)
        else:
            try:
                resp, _ = self.connection(ex).request(header)
            except WorkerGone:
                self.restart(ex)
                return None
        assert resp["ok"], resp
        return e

    def barrier(self, e: int, timeout: float = 60.0) -> bool:
        """Returns once maintenance queued so far on executor e's worker has run (True), or the worker died (False).

        A private store of this worker (partition 100+e) gets one more version and a maintenance
        that must delete its older versions; that maintenance is queued behind everything before it.
        """
        ex = self.ex[e]
        partition = 100 + e
        ids = ex.barrier_ids
        try:
            while max(ids, default=0) < 2:
                self._barrier_commit(ex, partition, max(ids, default=0) + 1)
            newest = max(ids) + 1
            self._barrier_commit(ex, partition, newest)
            header = self.header("maintenance", partition, minVersionsToRetain=2, version=newest)
            resp, _ = self.connection(ex).request(header)
            assert resp["ok"], resp
        except WorkerGone:
            self.restart(ex)
            return False
        lowest_kept = newest - 1
        storage = self.backend.storage(self.root(partition))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not ex.worker.alive():
                self.restart(ex)
                return False
            storage.fs.invalidate_cache()
            if min(self.list_store(storage, partition)[0], default=lowest_kept) >= lowest_kept:
                for v in [v for v in ids if v < lowest_kept]:
                    del ids[v]
                return True
            time.sleep(0.002)
        pytest.fail(f"maintenance of worker {ex.worker.pid} did not finish in {timeout}s; log:\n{ex.worker.log_tail()}")

    def _barrier_commit(self, ex: Executor, partition: int, version: int) -> None:
        header = self.header("commit", partition, version=version, baseCommitId=ex.barrier_ids.get(version - 1))
        resp, _ = self.connection(ex).request(header, encode({b"k0": b"%d" % version}))
        assert resp["ok"], f"barrier store commit failed: {resp}"
        ex.barrier_ids[version] = resp.get("commitId")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def storage_matches_model(self):
        """Every acknowledged version above the floor is in storage as acknowledged; no present manifest
        names a missing file (with no grace period: none at or above the floor)."""
        self.steps += 1
        type(self).steps_run += 1
        storage = self.backend.storage(self.root())
        stamps, records, files = self.list_store(storage)
        manifests = self._read_manifests(storage, stamps)
        for v, expected in self.versions.items():
            if v == 0 or v < self.floor:
                continue
            assert v in manifests, f"acknowledged version {v} (floor {self.floor}) is gone from storage"
            stored = manifests[v][1].commit_id
            assert not expected.ids or stored in expected.ids, \
                f"version {v} in storage has commit id {stored}, acknowledged {set(expected.ids)}"
            expected.ids = frozenset([stored])
        for v, (raw, manifest) in manifests.items():
            if self.grace == "0" and v < self.floor:
                continue
            named = set(manifest.paths)
            record = self._record(storage, v, manifest, records.get(v))
            if record is not None:
                named.add(record.snapshot.path)
                self.events["check: version with a compaction record"] += 1
            missing = named - files
            if not missing:
                continue
            # Not a race with a deletion of this version: the manifest is still there, unchanged.
            storage = self.backend.storage(self.root())
            try:
                again = storage.read_manifest(v)
            except VersionNotFound:
                continue
            still = missing - self.list_store(storage)[2]
            assert not (again == raw and still), \
                f"version {v}'s manifest or compaction record names missing files {sorted(still)}"
        if self.steps % 10 == 0:
            self.check_contents(list(self.versions))
        elif self.steps % 3 == 0:
            self.check_contents([self.head])

    def _record(self, storage, version: int, manifest: Manifest, stamp: str | None):
        """Version's compaction record (chk-N/_snapshot) if it is the one loads use: it folds this very manifest."""
        if stamp is None:
            return None
        record = self._record_cache.get((version, stamp))
        if record is None:
            data = storage.read_record(version, "_snapshot")
            if data is None:
                return None
            record = self._record_cache[(version, stamp)] = CompactionRecord.from_json(data, f"chk-{version}/_snapshot")
        return record if record.commit_id == manifest.commit_id else None

    def list_store(self, storage, partition: int = 0) -> tuple[dict[int, str], dict[int, str], set[str]]:
        """(manifests, compaction records, data files) from one recursive listing (spark_state's own
        listing globs chk-*/ one prefix at a time: a LIST per version on S3)."""
        path = storage.fs._strip_protocol(self.root(partition)).rstrip("/")
        try:
            found = storage.fs.find(path, detail=True)
        except FileNotFoundError:
            found = {}
        manifests, records, files = {}, {}, set()
        for name, info in found.items():
            m = _LISTED.match(name[len(path) + 1:])
            if m is None:
                continue
            if m.group(3):
                files.add(m.group(3))
            else:
                stamp = ":".join(str(info.get(k)) for k in ("size", "mtime", "ino", "ETag", "LastModified"))
                (manifests if m.group(2) == "_metadata" else records)[int(m.group(1))] = stamp
        return manifests, records, files

    def _read_manifests(self, storage, stamps: dict[int, str]) -> dict[int, tuple[bytes, Manifest]]:
        out = {}
        for v, stamp in stamps.items():
            cached = self._manifest_cache.get((v, stamp))
            if cached is None:
                try:
                    raw = storage.read_manifest(v)
                except VersionNotFound:
                    continue   # deleted since the listing
                cached = (raw, Manifest.from_json(raw, f"chk-{v}"))
                self._manifest_cache[(v, stamp)] = cached
            out[v] = cached
        return out

    def check_contents(self, versions) -> None:
        """Loads (as a read-only store: no executor's view changes) must return exactly what was acknowledged."""
        for i, v in enumerate(sorted(versions)):
            if v == 0:
                continue
            ex = self.ex[(self.steps + i) % EXECUTORS]
            resp, body = self.call(ex, self.header("load", version=v))
            if not resp["ok"]:
                assert v < self.floor and resp["kind"] == "VersionNotFound", f"load of {v} failed: {resp}"
                continue
            assert decode(body) == self.versions[v].content, \
                f"version {v} loads as {decode(body)}, acknowledged {self.versions[v].content}"

    def teardown(self):
        """Leaves the workers as the next example needs them: alive, no fault armed, no reply pending."""
        for ex in self.ex:
            self.disarm(ex)
            if ex.conn is not None:
                ex.conn.close()
                ex.conn = None
            if not ex.worker.alive():
                self.restart(ex)


# ---------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def s3_endpoint():
    """moto in a process of its own: three workers and the test load it hard."""
    url, proc = s3_server.start_process()
    yield url
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def workers(s3_endpoint):
    """Three workers for every example (each example has its own store), each with its own fault
    directory; spares started ahead make a restart cheap."""
    dirs = [Path(tempfile.mkdtemp(prefix="ssm-")) for _ in range(EXECUTORS)]
    for d in dirs:
        (d / "faults").mkdir()
    warm = {"op": "load", "version": 0, "options": {"maxParallelism": str(M)},   # imports the storage modules
            "store": {"sparkRoot": f"file://{dirs[0]}/warm", "location": f"file://{dirs[0]}/warm/0/0",
                      "operator": 0, "partition": 0, "queryId": QUERY_ID}}
    pool = [Worker(d, env={"SPARK_STATE_FAULT_DIR": str(d / "faults"), "AWS_ENDPOINT_URL": s3_endpoint},
                   wait=False, spare=True, warmup=warm)
            for d in dirs]
    yield pool
    for w, d in zip(pool, dirs):
        w.close()
        shutil.rmtree(d, ignore_errors=True)


def run_model(backend: Backend, workers, *, grace: str | None, examples: int, steps: int) -> None:
    machine = type(f"StoreModel_{backend.kind}", (StoreModel,), {
        "backend": backend, "workers": workers, "grace": grace, "fsync": grace is None, "events": collections.Counter()})
    started = time.monotonic()
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]))
    finally:
        print(f"\n{backend.kind} grace={grace}: {machine.examples_run} examples, {machine.steps_run} steps, "
              f"{time.monotonic() - started:.1f} s, worker starts {[w.starts for w in workers]}")
        for name, count in sorted(machine.events.items()):
            print(f"  {count:6d}  {name}")


#: Multiplies the number of examples (e.g. SPARK_STATE_MODEL_SCALE=20 for a soak run).
SCALE = float(os.environ.get("SPARK_STATE_MODEL_SCALE", "1"))


@pytest.mark.parametrize("kind,grace,examples", [("file", "0", 55), ("file", None, 12), ("s3", "0", 6)])
def test_model(kind, grace, examples, workers, s3_endpoint, tmp_path):
    """CI size: ~2000 steps in ~1.5 min on two cores. fileGracePeriod=0 lets retention delete at once, so every deletion rule is
    exercised; the default grace (with fsync) checks that nothing is deleted early either."""
    run_model(Backend(kind, tmp_path, s3_endpoint), workers, grace=grace, examples=max(1, round(examples * SCALE)),
              steps=40)


@pytest.mark.slow
@pytest.mark.parametrize("kind,examples", [("file", 200), ("s3", 30)])
def test_model_long(kind, examples, workers, s3_endpoint, tmp_path):
    """Longer histories (80 steps: compactions of compactions, retention of long chains)."""
    run_model(Backend(kind, tmp_path, s3_endpoint), workers, grace="0", examples=round(examples * SCALE), steps=80)
