"""One soak run: the world up, input flowing, four queries running, faults firing; then the end checks.

Everything it learns is appended to files in ``out`` as it goes (``samples.jsonl``, ``progress.jsonl``,
``faults.jsonl``, and the proxy's own log), and ``summary.json`` holds the end checks, so
``python -m benchmarks.soak --report-only`` rebuilds the report from a run that died near its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.soak import checks
from benchmarks.soak.cluster import BUCKET, STATE_ROOT, World
from benchmarks.soak.faults import BURST_S, KINDS, Event, Injector, Schedule
from benchmarks.soak.inputs import STREAMS, InputWriter, Shape
from benchmarks.soak.model import Model
from benchmarks.soak.queries import NAMES, SoakQuery, wait_for
from benchmarks.soak.samples import Sampler
from tests.cluster.faults import POINTS
from tests.cluster.running_totals import brief

#: Which source of a query reads which stream (the join reads two).
SOURCES = {"agg": ("events",), "sessions": ("events",), "dedup": ("events",), "join": ("left", "right")}


@dataclass
class Settings:
    minutes: float
    out: Path
    workdir: Path
    seed: int = 1
    #: one input file per stream every tick: 4 s keeps the four queries on two one-core executors ahead of their
    #: input (a 65-minute run at 2 s fell behind at ~15 of 30 ticks a minute), batches of up to max_files ticks
    tick_s: float = 4.0
    mean_gap_s: float = 25.0      # mean time between faults
    base_rate: float = 0.02       # S3 requests failed or stalled by the proxy outside bursts
    grace_s: float = 30.0         # fileGracePeriod
    orphan_slack_s: float = 30.0  # past the grace period: a few maintenance runs (every 5 s)
    #: how long files still unreferenced at the second look are watched further (every 30 s): one that goes
    #: meanwhile was deleted late (a worker's maintenance runs its stores one after another), one that stays
    #: is an orphan
    orphan_patience_s: float = 240.0
    trigger: str = "2 seconds"
    max_files: int = 30
    shape: Shape = Shape()
    sample_s: float = 5.0
    every_kind: bool = False      # go on past ``minutes`` until every kind of fault was performed once
    first_kinds: tuple[str, ...] = ()   # the kinds the schedule starts with
    #: spark_state's memoryLimit (None: the default); a small one makes every store spill into sorted runs
    memory_limit: str | None = None
    #: images beside every snapshot, read by range on every restore (rowImages.rangeReads=true)
    range_reads: bool = False


class Producer(threading.Thread):
    """Writes one tick of input every ``tick_s`` seconds until stopped."""

    def __init__(self, inputs: InputWriter, tick_s: float):
        super().__init__(name="soak-input", daemon=True)
        self.inputs, self.tick_s = inputs, tick_s
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.tick_s):
            self.inputs.write_tick()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def _log(out: Path, message: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {message}"
    print(line, flush=True)
    with open(out / "soak.log", "a") as f:
        f.write(line + "\n")


def run(cfg: Settings) -> dict:
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("samples.jsonl", "progress.jsonl", "faults.jsonl", "soak.log", "summary.json"):
        (out / name).unlink(missing_ok=True)
    options = {"storage": "filesystem", "checkpoint_root": STATE_ROOT, "snapshot_interval": 4,
               "file_grace_period": f"{cfg.grace_s:g}s"}
    if cfg.memory_limit:
        options["memory_limit"] = cfg.memory_limit
    if cfg.range_reads:
        options.update(row_images_min_rows=0, row_image_range_reads=True)
    world = World(cfg.workdir, seed=cfg.seed, options=options)
    world.tool_options = {"checkpointRoot": STATE_ROOT, "fileGracePeriod": f"{cfg.grace_s:g}s"}
    world.savepoints = f"s3://{BUCKET}/savepoints"
    started = time.time()
    summary: dict = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()
                                  if k != "shape"} | {"shape": cfg.shape.__dict__}, "started": started,
                     "niceness": os.nice(0), "git": _git_head()}
    try:
        world.start_storage()
        world.start_spark()
        _log(out, f"world up in {time.time() - started:.0f}s: S3 {world.moto_url} behind {world.env['AWS_ENDPOINT_URL']}")
        summary.update(_soak(cfg, world, out))
    finally:
        world.stop()
    summary["ended"] = time.time()
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _soak(cfg: Settings, world: World, out: Path) -> dict:
    markers = cfg.workdir / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    inputs = InputWriter(cfg.workdir / "input", cfg.seed, cfg.shape)
    for _ in range(3):
        inputs.write_tick()
    queries = {n: SoakQuery(n, world.spark, inputs, cfg.workdir, trigger=cfg.trigger, max_files=cfg.max_files,
                            markers=markers) for n in NAMES}
    for q in queries.values():
        q.start()
    producer = Producer(inputs, cfg.tick_s)
    producer.start()
    sampler = Sampler(world, queries, out, cfg.sample_s).start()
    schedule = Schedule(cfg.seed, cfg.mean_gap_s, first=cfg.first_kinds)
    injector = Injector(world, queries, schedule, markers, cfg.base_rate, out / "faults.jsonl",
                        burst_s=min(BURST_S, 4 * cfg.mean_gap_s))
    world.proxy.set(cfg.base_rate)
    soak_started = time.time()
    end = soak_started + cfg.minutes * 60
    next_fault = soak_started + schedule.gap()
    pending: list[Event] = []
    recoveries: list[dict] = []
    def going() -> bool:
        if time.time() < end:
            return True
        return cfg.every_kind and time.time() < end + 600 and \
            not set(KINDS) <= {e.kind for e in injector.events if e.ok}

    while going():
        injector.tick()
        _restart_failed(queries, injector, out)
        _note_recoveries(pending, recoveries, queries, out)
        if time.time() >= next_fault:
            kind = schedule.next_kind()
            event = injector.fire(kind)
            _log(out, f"fault {kind}: {event.detail} ({'ok' if event.ok else 'not performed'}, {event.took_s}s)")
            if event.ok:
                pending.append(event)
            next_fault = time.time() + schedule.gap()
        time.sleep(0.5)
    soak_s = time.time() - soak_started
    _log(out, f"soak over after {soak_s / 60:.1f} min; input stops at tick {inputs.ticks}, faults stop")
    producer.stop()
    injector.quiet()
    ticks = inputs.ticks
    _catch_up(queries, injector, out, ticks)
    _note_recoveries(pending, recoveries, queries, out)
    first = _unreferenced(world, queries)
    looked = time.time()
    _log(out, f"every query read every input file; {sum(len(v) for v in first.values())} file(s) retention may "
              f"delete; looking again after the grace period")
    if any(isinstance(files, str) or files for files in first.values()):
        # only files seen now can be orphans: with none to watch (or a listing to retry), nothing is waited for
        time.sleep(cfg.grace_s + cfg.orphan_slack_s)
    results = _end_checks(cfg, world, queries, ticks, out, first, time.time() - looked, looked)
    sampler.stop()
    for q in queries.values():
        q.stop()
    results.update(soak_s=soak_s, ticks=ticks, faults=[e.__dict__ for e in injector.events],
                   unrecovered=[e.__dict__ for e in pending], recoveries=recoveries,
                   fault_points_fired={p: len(world.faults.fired(p)) for p in POINTS},
                   task_reattempts=sorted(p.name for p in (markers / "attempts").iterdir()),
                   task_failures_claimed=sorted(p.name for p in markers.glob("fail.taken-*")),
                   proxy=world.proxy.totals(), sampler_error=sampler.error,
                   input_rows={s: ticks_rows(cfg, s, ticks) for s in STREAMS})
    return results


def _note_recoveries(pending: list[Event], recoveries: list[dict], queries: dict, out: Path) -> None:
    """A fault is recovered from once every query committed a batch after it (and after its own end)."""
    for event in list(pending):
        if all(q.last_batch_at > event.t + event.took_s for q in queries.values()):
            event.recovered_s = round(max(q.last_batch_at for q in queries.values()) - event.t, 1)
            recoveries.append({"t": event.t, "kind": event.kind, "recovered_s": event.recovered_s})
            with open(out / "recoveries.jsonl", "a") as f:
                f.write(json.dumps(recoveries[-1]) + "\n")
            pending.remove(event)


def ticks_rows(cfg: Settings, stream: str, ticks: int) -> int:
    from benchmarks.soak.inputs import rows_of

    return sum(len(rows_of(stream, cfg.seed, t, cfg.shape)) for t in range(ticks))


def _restart_failed(queries: dict, injector: Injector, out: Path) -> None:
    """A query that stopped with an error is started again from its checkpoint (a recovery, logged)."""
    for name, q in queries.items():
        message = q.failed()
        if message is None:
            continue
        event = Event(time.time(), "query-failed", f"{name}: {brief(message, 3)}")
        q.start()
        injector.record(event)
        _log(out, f"query {name} failed and was restarted: {event.detail}")


def _caught_up(q: SoakQuery, ticks: int) -> bool:
    wanted = {f"part-{t:07d}.json" for t in range(ticks)}
    for i, _ in enumerate(SOURCES[q.name]):
        read = set()
        for ckpt in q.checkpoints:
            read |= checks.source_files(ckpt, i)
        if not wanted <= read:
            return False
    from spark_state.spark.checkpoint import SparkCheckpoint

    ckpt = SparkCheckpoint(str(q.checkpoint))
    return ckpt.last_batch == ckpt.last_committed


def _catch_up(queries: dict, injector: Injector, out: Path, ticks: int, timeout: float = 1800) -> None:
    """Waits until every query read every input file and committed its last batch (restarting failed ones),
    then for two quiet triggers (a last batch for the watermark may follow the last data)."""
    def done() -> bool:
        _restart_failed(queries, injector, out)
        return all(_caught_up(q, ticks) for q in queries.values())

    wait_for(done, timeout, "every query reading all input")
    time.sleep(5)
    wait_for(done, timeout, "every query committing its last batch")


def _unreferenced(world: World, queries: dict) -> dict[str, set[str] | str]:
    """Per query, the files retention may delete now (checks.unreferenced), or why they could not be listed.
    Taken while the queries run: Spark runs maintenance (retention) only for loaded stores."""
    def one(q: SoakQuery) -> set[str] | str:
        try:
            return checks.unreferenced(world, q.checkpoint, world.tool_options)
        except Exception as err:  # noqa: BLE001 - reported as a problem by the end checks
            return f"listing failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}"

    with ThreadPoolExecutor(len(queries)) as pool:
        return dict(zip(queries, pool.map(one, queries.values())))


def _end_checks(cfg: Settings, world: World, queries: dict, ticks: int, out: Path, first: dict,
                waited_s: float, looked_at: float) -> dict:
    model = Model(cfg.seed, cfg.shape, ticks)
    options = world.tool_options
    results: dict = {"checks": {}, "queries": {}}
    problems: dict[str, list[str]] = {}
    second = _unreferenced(world, queries)
    left = {n: first[n] & second[n] for n in queries if isinstance(first[n], set) and isinstance(second[n], set)}
    at_second = {n: set(f) for n, f in left.items()}
    watch_until = time.time() + cfg.orphan_patience_s
    while any(left.values()) and time.time() < watch_until:
        time.sleep(30)
        again = _unreferenced(world, queries)
        left = {n: (f & again[n] if isinstance(again[n], set) else f) for n, f in left.items()}
    late_s = round(time.time() - looked_at, 1)
    for name in queries:
        if isinstance(first[name], str) or isinstance(second[name], str):
            count, found = 0, [m for m in (first[name], second[name]) if isinstance(m, str)]
        else:
            count, found = checks.orphans(left[name], left[name], late_s, cfg.grace_s)
        problems[f"{name}: orphans"] = found
        results["queries"][name] = {"orphans": count, "unreferenced_first_look":
                                  len(first[name]) if isinstance(first[name], set) else None,
                                  "deleted_late": len(at_second.get(name, set()) - left.get(name, set())),
                                  "watched_s": late_s}
        if count:   # the S3 server's storage is gone after the run: keep what settles whether they are orphans
            evidence = _guarded(lambda: checks.store_listing(world, queries[name].checkpoint, world.tool_options), {})
            (out / f"orphans-{name}.json").write_text(json.dumps(evidence, indent=1, sort_keys=True))
    if any(r["orphans"] for r in results["queries"].values()):
        _keep_worker_logs(cfg.workdir / "worker-logs")
    for q in queries.values():
        q.stop()

    def check(name: str) -> tuple[str, dict, dict]:
        q = queries[name]
        wm = checks.final_watermark(q.checkpoint)
        outputs = q.outputs.batches()
        loaded, load_problems = _guarded(lambda: checks.check_versions_load(q.checkpoint, options), (0, []))
        report, validate_problems = _guarded(lambda: checks.check_validate(q.checkpoint, options), ({}, []))
        found = {f"{name}: output": _guarded(lambda: checks.check_output(name, outputs, model, wm)),
                 f"{name}: state": _guarded(lambda: checks.check_state(name, q.checkpoint, options, model, wm)),
                 f"{name}: versions load": load_problems, f"{name}: validate": validate_problems}
        figures = dict(batches=len(outputs), rows_out=sum(len(r) for r in outputs.values()), versions_loaded=loaded,
                       validated_files=report.get("files"), validated_bytes=report.get("bytes"), watermark_ms=wm,
                       checkpoints=[c.name for c in q.checkpoints], failures=len(q.failures))
        return name, found, figures

    def check_guarded(name: str) -> tuple[str, dict, dict]:
        try:
            return check(name)
        except Exception as err:  # noqa: BLE001 - reported as a problem
            return name, {f"{name}: checks": [f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"]}, \
                {"batches": 0, "versions_loaded": 0}

    with ThreadPoolExecutor(len(queries)) as pool:   # storage round trips, no Spark: the queries are stopped
        for name, found, figures in pool.map(check_guarded, queries):
            problems.update(found)
            results["queries"][name].update(figures)
            _log(out, f"{name}: {figures['batches']} batches, {figures['versions_loaded']} versions loaded, "
                      f"{sum(len(v) for v in found.values())} problem(s)")
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line]
    results["memory"], problems["memory"] = checks.check_memory(samples)
    results["problems"] = {k: v for k, v in problems.items() if v}
    results["passed"] = not results["problems"]
    return results


def _keep_worker_logs(to: Path) -> None:
    """Copies the logs of the state workers alive now (retention's and compaction's record of the end checks'
    last minutes): a worker deletes its directory, log included, when its executor stops."""
    import glob
    import tempfile

    to.mkdir(parents=True, exist_ok=True)
    for log in set(glob.glob(os.path.join(tempfile.gettempdir(), "spark-state-*", "worker.log")) +
                   glob.glob("/tmp/spark-state-*/worker.log")):
        try:
            if os.path.getmtime(log) > time.time() - 600:   # not a killed worker's leftover
                shutil.copy(log, to / f"{Path(log).parent.name}.log")
        except OSError:
            pass   # the worker exited meanwhile


def _guarded(check, empty=()):
    """A check that raised is a problem of its own (named), never the end of the run's other checks."""
    try:
        return check()
    except Exception as err:  # noqa: BLE001 - reported as a problem
        problem = [f"the check itself failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}"]
        if isinstance(empty, tuple) and len(empty) == 2:
            return empty[0], problem
        return problem


def _git_head() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    return run.stdout.strip() or "?"


def cleanup(workdir: Path) -> None:
    """Removes the run's working directory (input, checkpoints, logs), which the caller created."""
    shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["KINDS", "Settings", "run", "cleanup"]
