"""State ten times the heap (issue 35): the large-state query at the heap users give executors.

    python -m benchmarks.large run --keys 10000000 --providers rocksdb,spark_state_fs
    python -m benchmarks.large phase --provider rocksdb --phase build --keys 10000000 --workdir DIR

The query is the issue's, exactly: ``readStream.parquet(src)`` with ``maxFilesPerTrigger=1`` over
files of distinct long keys (``k``, ``v = k % 1000``), ``groupBy("k").agg(sum("v"), count("*"))``,
update mode, ``foreachBatch`` writing to the ``noop`` format, ``local[2]``, 4 shuffle partitions,
``spark.driver.memory=1g``, every provider option at its default. Each phase is a NEW application
(a process of its own, so a fresh JVM and worker):

  build     the keys in two files of keys/2 each, one batch per file
  restart   one more file of 1,000 of those keys, one batch; checked exactly (sum 2·(k % 1000), count 2)
  steady    a new application: a warm-up batch of 1,000 keys, then batches changing 1% and 10% of the keys
  dedup     the same files through ``dropDuplicates(["k"])`` (its own checkpoint): build, then a restart
            with 1,000 seen and 1,000 new keys, checked exactly (only the new ones come out)

Every phase samples the memory of the application's process tree (the JVM and its children: spark_state's
worker, Python workers; each process's proportional set size, a process that shares its parent's address space
counted once) twice a second and reports the peak (``"memory": "pss"`` in each record; records without it hold
resident set sizes). ``run`` interleaves the
providers phase by phase and writes results.md / results.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESTART_KEYS = 1000


# ------------------------------------------------------------------ data

def make_data(data: Path, keys: int, seed: int = 35) -> dict[str, Path]:
    """Files of the query's input under `data` (made once per key count): two halves of distinct keys in
    random order, a restart file of 1,000 of them, steady files of 1% and 10%, and dedup's new keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = data / f"k{keys}"
    stamp = root / "_SPEC"
    spec = f"{keys} {seed} v2"
    files = {name: root / f"{name}.parquet" for name in
             ("half0", "half1", "restart", "warm", "steady1", "steady10", "dedup_restart")}
    if stamp.exists() and stamp.read_text() == spec:
        return files
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(keys).astype(np.int64)

    def write(name: str, k: np.ndarray) -> None:
        pq.write_table(pa.table({"k": k, "v": k % 1000}), files[name], row_group_size=1 << 20)

    write("half0", order[: keys // 2])
    write("half1", order[keys // 2:])
    write("restart", rng.choice(keys, RESTART_KEYS, replace=False).astype(np.int64))
    write("warm", rng.choice(keys, RESTART_KEYS, replace=False).astype(np.int64))
    write("steady1", rng.choice(keys, keys // 100, replace=False).astype(np.int64))
    write("steady10", rng.choice(keys, keys // 10, replace=False).astype(np.int64))
    seen = rng.choice(keys, RESTART_KEYS, replace=False).astype(np.int64)
    new = np.arange(keys, keys + RESTART_KEYS, dtype=np.int64)
    write("dedup_restart", np.concatenate([seen, new]))
    stamp.write_text(spec)
    return files


def _feed(src: Path, file: Path, n: int) -> None:
    """Puts `file` into the query's source directory as its n-th file (the source orders by modification time)."""
    src.mkdir(parents=True, exist_ok=True)
    dst = src / f"part-{n:03d}.parquet"
    shutil.copyfile(file, dst)
    t = 1_700_000_000 + n
    os.utime(dst, (t, t))


# ------------------------------------------------------------------ memory sampling

def _tree(pid: int) -> dict[int, tuple[str, int]]:
    """Name and proportional set size (PSS) of `pid` and each of its descendants (Linux /proc).

    PSS, not RSS: a page shared by n processes counts 1/n in each (pages shared with processes outside the tree,
    such as the libraries of this sampler, count in part). A JVM starts a child to run a command (RocksDB's provider
    runs `chmod` on its files); until the child execs, it shares the JVM's pages (fork) or its whole address space
    (posix_spawn's vfork, the JDK's default on Linux), and RSS counted the JVM twice: a build of 10M keys once
    "peaked" at 3,055 MiB against 1,528 MiB of JVM. A child in its parent's address space is left out here, since
    its PSS is its parent's; a forked child's copy-on-write pages are split between the two.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [(pid, None)]
    while todo:
        p, parent = todo.pop()
        if parent is not None and _same_memory(parent, p):
            continue   # a vfork'd child before its exec: its memory is its parent's
        try:
            size = _pss(p)
            with open(f"/proc/{p}/comm") as f:
                out[p] = (f.read().strip(), size)
        except (OSError, IndexError, ValueError):
            pass
        todo.extend((c, p) for c in children.get(p, ()))
    return out


#: kcmp(2)'s number by machine (its type KCMP_VM, 1, compares two processes' address spaces).
_KCMP = {"x86_64": 312, "aarch64": 272}


@functools.cache
def _kcmp():
    """libc's syscall() and kcmp's number on this machine, or None where it is not known (loaded once: the
    sampler asks for every child of the tree twice a second)."""
    import ctypes
    import platform

    nr = _KCMP.get(platform.machine())
    return None if nr is None else (ctypes.CDLL(None, use_errno=True).syscall, nr)


def _same_memory(a: int, b: int) -> bool:
    """Whether processes a and b share one address space (kcmp(2) KCMP_VM); False where that cannot be told."""
    kcmp = _kcmp()
    if kcmp is None:
        return False
    syscall, nr = kcmp
    return syscall(nr, a, b, 1, 0, 0) == 0   # 1: KCMP_VM


def _pss(pid: int) -> int:
    """Bytes of `pid`'s proportional set size (smaps_rollup), else its resident set size (older kernels)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler:
    """The peak memory (PSS, :func:`_tree`) of this process's children (the JVM and everything it started), and at
    that moment each kind of process's share (java: the JVM; python: the state worker and Spark's Python workers)."""

    def __init__(self, every: float = 0.5):
        self.every = every
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self.peak_by: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            by: dict[str, int] = {}
            for pid, (name, rss) in _tree(me).items():
                if pid != me:
                    kind = "python" if name.startswith("python") else name
                    by[kind] = by.get(kind, 0) + rss
            total = sum(by.values())
            for kind, rss in by.items():
                self.peak_by[kind] = max(self.peak_by.get(kind, 0), rss)
            if total > self.peak:
                self.peak, self.at_peak = total, by
            self._stop.wait(self.every)


# ------------------------------------------------------------------ one phase (one application)

def _session(provider: str, heap: str, extra: dict[str, str]):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    b = (SparkSession.builder.master("local[2]").appName(f"large-{provider}")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", heap)
         .config("spark.driver.extraJavaOptions",
                 f"-Dlog4j2.configurationFile={HERE / 'jvm' / 'log4j2.properties'} -XX:+ExitOnOutOfMemoryError"
                 + (" " + os.environ["LARGE_JAVA_OPTS"] if os.environ.get("LARGE_JAVA_OPTS") else "")
                 + (f" -XX:StartFlightRecording=filename={os.environ['LARGE_JFR']},settings=profile"
                    if os.environ.get("LARGE_JFR") else "")))
    if provider == "spark_state_fs":
        import spark_state
        b = spark_state.configure(b)
    elif provider == "rocksdb":
        b = b.config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    elif provider != "hdfs":
        raise SystemExit(f"unknown provider {provider}")
    for k, v in extra.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_phase(provider: str, phase: str, keys: int, workdir: Path, data: Path, heap: str,
              extra: dict[str, str]) -> dict:
    from pyspark.sql import functions as F

    files = make_data(data, keys)
    dedup = phase.startswith("dedup")
    src = workdir / ("src-dedup" if dedup else "src")
    ckpt = workdir / ("ckpt-dedup" if dedup else "ckpt")
    feeds = {"build": ["half0", "half1"], "restart": ["restart"], "steady": ["warm", "steady1", "steady10"],
             "dedup-build": ["half0", "half1"], "dedup-restart": ["dedup_restart"]}[phase]
    if phase in ("build", "dedup-build"):
        for d in (src, ckpt):
            if d.exists():
                shutil.rmtree(d)
    n0 = len(list(src.glob("part-*.parquet"))) if src.exists() else 0
    for i, name in enumerate(feeds):
        _feed(src, files[name], n0 + i)

    checked: dict = {}
    spark = _session(provider, heap, extra)
    with PeakSampler() as sampler:
        t0 = time.perf_counter()
        try:
            df = spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).parquet(str(src))
            if dedup:
                out = df.dropDuplicates(["k"])
            else:
                out = df.groupBy("k").agg(F.sum("v").alias("s"), F.count("*").alias("n"))
            verify = phase in ("restart", "dedup-restart")

            def sink(batch, batch_id):
                if verify:
                    rows = batch.collect()
                    checked["rows"] = len(rows)
                    if dedup:
                        checked["exact"] = sorted(r["k"] for r in rows) == list(range(keys, keys + RESTART_KEYS))
                    else:
                        checked["exact"] = len(rows) == RESTART_KEYS and all(
                            r["n"] == 2 and r["s"] == 2 * (r["k"] % 1000) for r in rows)
                else:
                    batch.write.format("noop").mode("overwrite").save()

            q = (out.writeStream.outputMode("update" if not dedup else "append").foreachBatch(sink)
                 .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
            q.awaitTermination()
            wall = time.perf_counter() - t0
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            batches = []
            for p in q.recentProgress:
                if not p.numInputRows:
                    continue
                ops = p.stateOperators or []
                batches.append({
                    "batch": p.batchId, "rows": p.numInputRows,
                    "trigger_ms": p.durationMs.get("triggerExecution", 0),
                    "add_batch_ms": p.durationMs.get("addBatch", 0),
                    "state_updates_ms": sum(o.allUpdatesTimeMs for o in ops),
                    "state_commit_ms": sum(o.commitTimeMs for o in ops),
                    "state_rows": sum(o.numRowsTotal for o in ops),
                    "memory_used_bytes": sum(o.memoryUsedBytes for o in ops),
                    "custom": {k: v for o in ops for k, v in (o.customMetrics or {}).items()},
                })
            gc_ms = sum(b.getCollectionTime() for b in
                        spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans())
        finally:
            spark.stop()
    result = {"provider": provider, "phase": phase, "keys": keys, "heap": heap, "wall_s": wall,
              "batches": batches, "memory": "pss", "peak_rss_bytes": sampler.peak, "rss_at_peak": sampler.at_peak,
              "peak_rss_by_process": sampler.peak_by, "gc_ms": gc_ms, **checked}
    return result


# ------------------------------------------------------------------ driver

def _phase_process(provider, phase, keys, workdir, data, heap, extra, log: Path) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.large", "phase", "--provider", provider, "--phase", phase,
           "--keys", str(keys), "--workdir", str(workdir), "--data", str(data), "--heap", heap]
    for k, v in extra.items():
        cmd += ["--conf", f"{k}={v}"]
    t0 = time.perf_counter()
    out = log.with_suffix(".stdout")
    with open(log, "a") as err, open(out, "w") as stdout:
        err.write("$ " + " ".join(cmd) + "\n")
        err.flush()
        # a session of its own: a JVM that outlives its driver (seen with RocksDB) is killed with it
        p = subprocess.Popen(cmd, stdout=stdout, stderr=err, text=True, cwd=HERE.parent, start_new_session=True)
        p.wait()
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    printed = out.read_text()
    for line in printed.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (printed + log.read_text()).splitlines()
    reason = next((l for l in tail if "OutOfMemoryError" in l), None) or next(
        (l for l in reversed(tail[-60:]) if "Error" in l or "Exception" in l), f"exit code {p.returncode}")
    return {"provider": provider, "phase": phase, "keys": keys, "heap": heap, "failed": reason.strip()[:400],
            "wall_s": time.perf_counter() - t0}



# ------------------------------------------------------------------ report

#: (figure, goal ratio or None, how to read it off the results of one key count)
def _figures(results: list[dict], keys: int) -> list[tuple[str, str, float | None]]:
    """(label, metric key, goal) of the issue's table; a metric reads (provider) -> value or None."""
    return [
        ("build, both batches (s)", "build_s", 1.0),
        ("first batch of a new application (s)", "restart_s", 0.8),
        ("steady batch changing 1% of the keys (s)", "steady1_s", 0.8),
        ("steady batch changing 10% of the keys (s)", "steady10_s", 0.8),
        ("dropDuplicates: build, both batches (s)", "dedup_build_s", 1.0),
        ("dropDuplicates: first batch after a restart (s)", "dedup_restart_s", 0.8),
        ("peak memory (PSS) of the build, JVM + children (MiB)", "build_rss_mib", 1.0),
    ]


def _metrics(results: list[dict], provider: str, keys: int) -> dict:
    """The figures of one provider at one key count, from its phases' records (None where it failed)."""
    by_phase = {r["phase"]: r for r in results if r["provider"] == provider and r["keys"] == keys}

    def batches(phase):
        r = by_phase.get(phase)
        return None if r is None or "failed" in r else [b["trigger_ms"] / 1000 for b in r["batches"]]

    m = {}
    b = batches("build")
    m["build_s"] = sum(b) if b else None
    b = batches("restart")
    m["restart_s"] = b[0] if b else None
    b = batches("steady")
    m["steady1_s"], m["steady10_s"] = (b[1], b[2]) if b and len(b) >= 3 else (None, None)
    b = batches("dedup-build")
    m["dedup_build_s"] = sum(b) if b else None
    b = batches("dedup-restart")
    m["dedup_restart_s"] = b[0] if b else None
    r = by_phase.get("build")
    m["build_rss_mib"] = r["peak_rss_bytes"] / 2**20 if r and "failed" not in r else None
    m["outcome"] = {ph: ("failed: " + r["failed"]) if "failed" in r else
                    ("exact" if r.get("exact") else "wrong" if r.get("exact") is False else "ran")
                    for ph, r in by_phase.items()}
    return m


def report(results: list[dict], out: Path, command: str) -> None:
    """results.md (the issue's table: each figure for RocksDB and spark_state, their ratio, the goal) and
    ratios.png, for every key count in `results`."""
    lines = ["# State ten times the heap: spark_state beside Spark's RocksDB provider", "",
             f"`{command}`; `local[2]`, 4 shuffle partitions, `spark.driver.memory={results[0]['heap']}`, every "
             "provider option at its default, each phase a new application. Ratios are spark_state ÷ RocksDB "
             "(lower is better).", ""]
    plots = []
    for keys in sorted({r["keys"] for r in results}):
        ours, rocks = _metrics(results, "spark_state_fs", keys), _metrics(results, "rocksdb", keys)
        lines += [f"## {keys:,} keys", "", "| figure | RocksDB | spark_state | ratio | goal | met |",
                  "|---|---:|---:|---:|---:|---|"]
        for label, key, goal in _figures(results, keys):
            a, b = rocks.get(key), ours.get(key)
            if a is None and b is None:
                continue
            ratio = b / a if a and b is not None else None
            met = "" if ratio is None or goal is None else ("yes" if ratio <= goal else f"no, by {ratio / goal - 1:.0%}")
            fmt = (lambda v: "—" if v is None else f"{v:,.0f}" if key.endswith("mib") else f"{v:.1f}")
            lines.append(f"| {label} | {fmt(a)} | {fmt(b)} | {'—' if ratio is None else f'{ratio:.2f}×'} | "
                         f"{'' if goal is None else f'≤ {goal:.1f}×'} | {met} |")
            if ratio is not None:
                plots.append((f"{keys // 1_000_000}M: {label}", ratio, goal))
        lines += ["", "Outcome of each phase:", ""]
        for provider in sorted({r["provider"] for r in results if r["keys"] == keys}):
            phases = _metrics(results, provider, keys)["outcome"]
            lines.append(f"- {provider}: " + ", ".join(f"{ph} {o}" for ph, o in phases.items()))
        shares = [(r["provider"], r["rss_at_peak"]) for r in results
                  if r["keys"] == keys and r["phase"] == "build" and r.get("rss_at_peak")]
        if shares:
            lines += ["", "Memory (PSS) at the build's peak, by process (MiB; `java` holds RocksDB's native memory, "
                      "`python` is spark_state's state worker):", ""]
            lines += [f"- {provider}: " + ", ".join(f"{kind} {rss / 2**20:,.0f}" for kind, rss in sorted(by.items())
                                                     if rss) for provider, by in shares]
        lines.append("")
    lines += ["Raw records (every batch, GC time, the spark_state metrics of each batch): `results.json`.", ""]
    (out / "results.md").write_text("\n".join(lines))
    if plots:
        _plot(plots, out / "ratios.png")


def _plot(rows: list[tuple[str, float, float | None]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    labels = [r[0] for r in rows][::-1]
    ratios = [r[1] for r in rows][::-1]
    goals = [r[2] for r in rows][::-1]
    colors = ["tab:green" if g is None or v <= g else "tab:red" for v, g in zip(ratios, goals)]
    ax.barh(labels, ratios, color=colors)
    for y, g in enumerate(goals):
        if g is not None:
            ax.plot([g, g], [y - 0.4, y + 0.4], color="black", linewidth=1)
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("spark_state ÷ RocksDB (lower is better; black tick: the goal)")
    ax.set_title("State ten times the heap (1 GiB heap, local[2], defaults)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("phase", help="one phase in this process (a new application)")
    one.add_argument("--provider", required=True)
    one.add_argument("--phase", required=True, choices=["build", "restart", "steady", "dedup-build", "dedup-restart"])
    run = sub.add_parser("run", help="every phase for every provider, interleaved")
    run.add_argument("--providers", default="rocksdb,spark_state_fs")
    run.add_argument("--phases", default="build,restart,steady,dedup-build,dedup-restart")
    run.add_argument("--out", type=Path, default=HERE / "out" / "large")
    run.add_argument("--hdfs", action="store_true", help="also run the build phase on Spark's HDFS provider")
    rep = sub.add_parser("report", help="results.md and ratios.png again from a results.json")
    rep.add_argument("results", type=Path)
    for p in (one, run):
        p.add_argument("--keys", type=int, default=10_000_000)
        p.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bench-large")
        p.add_argument("--data", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bench-large-data")
        p.add_argument("--heap", default="1g")
        p.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value")
    args = ap.parse_args(argv)
    if args.cmd == "report":
        report(json.loads(args.results.read_text()), args.results.parent, "python -m benchmarks.large run")
        return 0
    extra = dict(c.split("=", 1) for c in args.conf)
    if args.cmd == "phase":
        res = run_phase(args.provider, args.phase, args.keys, args.workdir / args.provider, args.data, args.heap,
                        extra)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    make_data(args.data, args.keys)
    command = "python -m benchmarks.large " + " ".join(argv if argv is not None else sys.argv[1:])
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    results = [r for r in results if r["keys"] != args.keys]   # a key count is measured again whole
    jobs = [(provider, phase) for phase in args.phases.split(",") for provider in args.providers.split(",")]
    if args.hdfs:
        jobs.insert(0, ("hdfs", "build"))
    for provider, phase in jobs:
        res = _phase_process(provider, phase, args.keys, args.workdir / provider, args.data, args.heap, extra,
                             args.out / f"{provider}.log")
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k != "batches"}), flush=True)
        results_file.write_text(json.dumps(results, indent=1))
        report(results, args.out, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
