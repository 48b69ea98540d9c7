"""Runs every benchmark scenario for every state-store provider, side by side, and writes the report.

    python -m benchmarks.run [--quick] [--out DIR]

Providers: Spark's HDFSBackedStateStoreProvider (default), RocksDBStateStoreProvider
with and without changelog checkpointing, and spark_state with filesystem and
memory storage. Each (provider, scenario, size) runs in its own JVM (micro
scenarios) or its own SparkSession process (end-to-end scenarios), on the same
data, one after the other, providers interleaved so background load hits all
of them alike.

Writes results.md, results.json and *.png into the output folder (default
benchmarks/out/). See benchmarks/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks import jvm_bench, report
from benchmarks.e2e import make_data, summarize
from benchmarks.providers import OURS, PEERS, all_providers, spark_state_status

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Profile:
    name: str
    micro_sizes: list[int]
    memory_sizes: list[int]
    restore_sizes: list[int]
    batches: int                  # checkpoint scenario: batches written before measuring
    change_pct: float             # ... each changing this share of the keys
    agg: dict = field(default_factory=dict)      # files, rows_per_file, keys
    pandas: dict = field(default_factory=dict)
    partitions: int = 4
    driver_memory: str = "2g"


QUICK = Profile("quick", micro_sizes=[10_000], memory_sizes=[10_000], restore_sizes=[10_000],
                batches=5, change_pct=10.0,
                agg=dict(files=3, rows_per_file=10_000, keys=10_000),
                pandas=dict(files=3, rows_per_file=5_000, keys=1_000))
FULL = Profile("full", micro_sizes=[100_000, 1_000_000], memory_sizes=[1_000_000],
               restore_sizes=[100_000, 1_000_000], batches=10, change_pct=10.0,
               agg=dict(files=8, rows_per_file=500_000, keys=1_000_000),
               pandas=dict(files=5, rows_per_file=50_000, keys=10_000),
               driver_memory="4g")

# what a restore measures beside getStore's time (raw key, metric label, unit; lower is better)
RESTORE_EXTRAS = [
    ("first_get_ms", "first get after the restore", "ms"),
    ("iterate_ms", "full scan after the restore", "ms"),
    ("restore_heap_bytes_per_row", "JVM heap per row after the restore (after GC)", "B"),
    ("batch_1pct_after_restore_ms", "first batch after the restore: get+put 1% of keys, commit", "ms"),
    ("batch_heap_bytes_per_row", "JVM heap per row after that batch (after GC)", "B"),
]

# (raw key, metric label, unit, better, scale)
MICRO_METRICS = [
    ("put_ns", "put, insert (per row)", "ns", "lower", 1),
    ("get_ns", "get (per row)", "ns", "lower", 1),
    ("update_10pct_ns", "put, update (per row)", "ns", "lower", 1),
    ("remove_ns", "remove (per row)", "ns", "lower", 1),
    ("commit_initial_ms", "commit, initial load (100% new)", "ms", "lower", 1),
    ("commit_1pct_ms", "commit, 1% changed", "ms", "lower", 1),
    ("commit_10pct_ms", "commit, 10% changed", "ms", "lower", 1),
    ("commit_100pct_ms", "commit, 100% changed", "ms", "lower", 1),
    ("batch_1pct_ms", "batch (getStore+puts+commit), 1%", "ms", "lower", 1),
    ("batch_10pct_ms", "batch (getStore+puts+commit), 10%", "ms", "lower", 1),
    ("batch_100pct_ms", "batch (getStore+puts+commit), 100%", "ms", "lower", 1),
]


def git_rev() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def mem_gib() -> int:
    try:
        with open("/proc/meminfo") as f:
            return round(int(f.readline().split()[1]) / 2**20)
    except OSError:
        return 0


class Runner:
    def __init__(self, args, profile: Profile, providers, shim_jar, console: Console):
        self.args = args
        self.profile = profile
        self.providers = providers
        self.shim_jar = shim_jar
        self.console = console
        self.out: Path = args.out
        self.work = self.out / "work"
        self.logs = self.out / "logs"
        self.records: list[dict] = []
        self.raw: dict = {}
        self.skipped: list[str] = []

    # -------------------------------------------------------------- bookkeeping
    def record(self, scenario, metric, label, unit, better, size, provider, value):
        self.records.append(dict(scenario=scenario, metric=metric, label=label, unit=unit, better=better,
                                 size=size, provider=provider.name, value=value))

    def fail(self, what: str, exc: BaseException):
        msg = str(exc).strip()
        # keep the first line and the most telling line of the log tail
        telling = [ln for ln in msg.splitlines() if "Exception" in ln or "Error" in ln or "error" in ln]
        short = msg.splitlines()[0] if msg else repr(exc)
        if telling:
            short += " … " + telling[-1].strip()
        self.skipped.append(f"{what}: FAILED — {short[:600]}")
        self.console.log(f"[red]{what} failed[/red]: {short[:300]}")

    # -------------------------------------------------------------- jobs
    def jobs(self):
        p = self.profile
        provs = self.providers
        only = set(self.args.only.split(",")) if self.args.only else None
        want = (lambda s: only is None or s in only)
        if want("micro"):
            for n in p.micro_sizes:
                for pr in provs:
                    yield f"micro {report.fmt_size(n)} {pr.name}", self.micro, (pr, n)
        if want("restore") or want("checkpoint"):
            for n in p.restore_sizes:
                for pr in provs:
                    yield f"checkpoint+restore {report.fmt_size(n)} {pr.name}", self.checkpoint_restore, (pr, n)
        if want("memory"):
            for n in p.memory_sizes:
                for pr in provs:
                    yield f"memory {report.fmt_size(n)} {pr.name}", self.memory, (pr, n)
        for scen in ("agg", "pandas"):
            if want(scen):
                for pr in provs:
                    if pr.variant:
                        self.skipped.append(f"e2e {scen} {pr.name}: not run — an A/B variant runs in the JVM "
                                            f"scenarios only (benchmarks/jvm/VariantProviders.java)")
                        continue
                    yield f"e2e {scen} {pr.name}", self.e2e, (pr, scen)

    def micro(self, pr, n):
        d = self.work / f"micro-{pr.name}-{n}"
        shutil.rmtree(d, ignore_errors=True)
        res = jvm_bench.run(pr, "micro", n, d, self.logs / f"micro-{pr.name}-{n}.log", shim_jar=self.shim_jar)
        self.raw[f"micro/{pr.name}/{n}"] = res
        for key, label, unit, better, scale in MICRO_METRICS:
            if key in res:
                self.record("micro", key, label, unit, better, n, pr, res[key] * scale)
        shutil.rmtree(d, ignore_errors=True)
        return f"put {res['put_ns']:.0f} ns, get {res.get('get_ns', 0):.0f} ns, commit10% {res['commit_10pct_ms']:.0f} ms"

    def checkpoint_restore(self, pr, n):
        p = self.profile
        d = self.work / f"ckpt-{pr.name}-{n}"
        shutil.rmtree(d, ignore_errors=True)
        log = self.logs / f"checkpoint-{pr.name}-{n}.log"
        if pr.storage == "memory":
            # memory storage cannot outlive its worker: restore on a fresh provider in the same JVM
            res = jvm_bench.run(pr, "write+restore", n, d, log, shim_jar=self.shim_jar, batches=p.batches,
                                change_pct=p.change_pct)
            w = r = res
        else:
            w = jvm_bench.run(pr, "write", n, d, log, shim_jar=self.shim_jar, batches=p.batches,
                              change_pct=p.change_pct)
            r = jvm_bench.run(pr, "restore", n, d, self.logs / f"restore-{pr.name}-{n}.log",
                              shim_jar=self.shim_jar, version=w["version"])
        self.raw[f"checkpoint/{pr.name}/{n}"] = w
        self.raw[f"restore/{pr.name}/{n}"] = r
        if r.get("num_keys") not in (None, -1, n) or not r.get("found", True):
            self.skipped.append(f"restore {pr.name} {n}: restored {r.get('num_keys')} keys (expected {n}), "
                                f"probe key found={r.get('found')}")
        self.record("restore", "restore_ms", "getStore(latest) on a fresh provider", "ms", "lower", n, pr,
                    r["restore_ms"])
        for key, label, unit in RESTORE_EXTRAS:
            if key in r:
                self.record("restore", key, label, unit, "lower", n, pr, max(0.0, r[key]))
        commits = w["commit_ms"][1:] or w["commit_ms"]
        self.record("checkpoint", "commit_mean_ms", f"commit, mean of batches 2..{p.batches} "
                    f"({p.change_pct:g}% changed)", "ms", "lower", n, pr, sum(commits) / len(commits))
        if pr.storage != "memory":
            self.record("checkpoint", "checkpoint_bytes", f"bytes on disk after {p.batches} batches", "MiB",
                        "lower", n, pr, w["checkpoint_bytes"])
            self.record("checkpoint", "checkpoint_files", f"files after {p.batches} batches", "files", "lower",
                        n, pr, w["checkpoint_files"])
        shutil.rmtree(d, ignore_errors=True)
        return (f"restore {r['restore_ms']:.0f} ms, {w['checkpoint_bytes'] / 2**20:.1f} MiB in "
                f"{w['checkpoint_files']} files")

    def memory(self, pr, n):
        d = self.work / f"mem-{pr.name}-{n}"
        shutil.rmtree(d, ignore_errors=True)
        res = jvm_bench.run(pr, "memory", n, d, self.logs / f"memory-{pr.name}-{n}.log", shim_jar=self.shim_jar)
        self.raw[f"memory/{pr.name}/{n}"] = res
        heap = max(0.0, res["heap_bytes_per_row"])
        off = max(0.0, res["offheap_bytes_per_row"])
        kid = max(0.0, res["child_rss_bytes_per_row"])
        self.record("memory", "total_bytes_per_row", "heap + off-heap + worker RSS per row", "B", "lower", n, pr,
                    heap + off + kid)
        self.record("memory", "heap_bytes_per_row", "JVM heap per row (after GC)", "B", "lower", n, pr, heap)
        self.record("memory", "offheap_bytes_per_row", "JVM off-heap RSS per row", "B", "lower", n, pr, off)
        self.record("memory", "child_rss_bytes_per_row", "worker process RSS per row", "B", "lower", n, pr, kid)
        shutil.rmtree(d, ignore_errors=True)
        return f"heap {heap:.0f} B/row, off-heap {off:.0f} B/row, worker {kid:.0f} B/row"

    def e2e(self, pr, scen):
        spec = getattr(self.profile, scen)
        data = self.work / f"data-{scen}"
        make_data(data, **spec)
        wd = self.work / f"e2e-{scen}-{pr.name}"
        log = self.logs / f"e2e-{scen}-{pr.name}.log"
        cmd = [sys.executable, "-m", "benchmarks.e2e", "--provider", pr.name, "--scenario", scen,
               "--data", str(data), "--workdir", str(wd), "--partitions", str(self.profile.partitions),
               "--driver-memory", self.profile.driver_memory]
        res = jvm_bench.run_for_result(cmd, Path(log), f"e2e {scen} {pr.name}", timeout=3600, cwd=ROOT)
        s = res.get("summary") or summarize(res)
        self.raw[f"{scen}/{pr.name}"] = res
        rows_total = spec["files"] * spec["rows_per_file"]
        n = f"{report.fmt_size(spec['keys'])} keys"
        self.record(scen, "rows_per_s", f"rows/s, batches 2..{spec['files']}", "rows/s", "higher", n, pr,
                    s["rows_per_s"])
        self.record(scen, "batch_ms", "batch time (triggerExecution), mean", "ms", "lower", n, pr, s["batch_ms"])
        if s.get("first_batch_ms") is not None:
            self.record(scen, "first_batch_ms", "first batch of a new application (triggerExecution)", "ms", "lower",
                        n, pr, s["first_batch_ms"])
        self.record(scen, "commit_ms_per_batch", "state commit per batch (sum over tasks)", "ms", "lower", n, pr,
                    s["commit_ms_per_batch"])
        self.record(scen, "commit_share", "commit share of batch time", "%", "lower", n, pr, s["commit_share"])
        if pr.storage != "memory":
            self.record(scen, "state_bytes", "state dir bytes at the end", "MiB", "lower", n, pr,
                        s["state_bytes"])
        shutil.rmtree(wd, ignore_errors=True)
        return (f"{s['rows_per_s']:,.0f} rows/s, commit {100 * (s['commit_share'] or 0):.1f}% "
                f"({rows_total:,} rows, {s['num_batches']} batches)")

    # -------------------------------------------------------------- main loop
    def run(self):
        jobs = list(self.jobs())
        t0 = time.time()
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False) as progress:
            task = progress.add_task("benchmarks", total=len(jobs))
            for what, fn, fargs in jobs:
                progress.update(task, description=what)
                t1 = time.time()
                try:
                    summary = fn(*fargs)
                    self.console.log(f"[green]✓[/green] {what} ({time.time() - t1:.0f}s): {summary}")
                except Exception as exc:  # noqa: BLE001 - one failure must not stop the others
                    if self.args.verbose:
                        traceback.print_exc()
                    self.fail(what, exc)
                progress.advance(task)
                self.write(time.time() - t0, final=False)
            progress.update(task, description="done")
        return self.write(time.time() - t0, final=True)

    def write(self, wall: float, final: bool):
        import pyspark

        p = self.profile
        notes = [
            f"Sizes: micro {', '.join(map(report.fmt_size, p.micro_sizes))} rows; restore/checkpoint "
            f"{', '.join(map(report.fmt_size, p.restore_sizes))} rows ({p.batches} batches, "
            f"{p.change_pct:g}% of keys changed per batch after the first); memory "
            f"{', '.join(map(report.fmt_size, p.memory_sizes))} rows; agg {p.agg}; pandas {p.pandas}; "
            f"{p.partitions} shuffle partitions, local[2].",
            "Keys are UnsafeRow(long); values UnsafeRow(long, long, double, int, string16) = 64 bytes.",
            "Micro per-row times have the cost of building the key/value rows subtracted; every provider "
            "runs a 20k-row warm-up in the same JVM first.",
            f"spark_state memory storage runs with memory.maxStateSize={self._mem_limit()} "
            "(raised explicitly from the 5 MiB default so it can hold the same state); its checkpoint "
            "bytes are not on disk and are not reported.",
            "Restore for HDFS, RocksDB and spark_state filesystem runs in a new JVM after the writer JVM "
            "exited (OS page cache warm); spark_state memory restores on a fresh provider in the same JVM "
            "(its state cannot outlive the worker).",
            "The machine was shared with other work while this ran: treat differences below ~1.3× as noise.",
        ]
        if 10_000_000 not in p.micro_sizes:
            notes.append("10M rows not run in this profile (pass --xl to add it; needs ~16 GiB heap "
                         "headroom and ~30+ min).")
        meta = {"profile": p.name, "started": self.started, "host": platform.node(), "cpus": os.cpu_count(),
                "mem_gib": mem_gib(), "spark": pyspark.__version__, "git": git_rev(), "wall_s": wall,
                "notes": notes, "skipped": self.skipped, "profile_spec": asdict(p), "complete": final}
        providers = [{"name": pr.name, "label": pr.label, "class": pr.cls, "confs": pr.confs}
                     for pr in self.providers]
        charts = []
        if final and self.records:
            try:
                charts = report.write_charts(self.out, providers, self.records)
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(f"charts: {exc!r}")
        meta["charts"] = charts
        report.write_json(self.out / "results.json", meta, providers, self.records, self.raw)
        report.write_markdown(self.out / "results.md", meta, providers, self.records)
        return meta

    def _mem_limit(self):
        from benchmarks.providers import BENCH_MEMORY_MAX_STATE_SIZE

        return BENCH_MEMORY_MAX_STATE_SIZE


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, a few minutes on 2 cores")
    ap.add_argument("--xl", action="store_true", help="add 10M rows to micro, restore and memory (full only)")
    ap.add_argument("--out", type=Path, default=HERE / "out", help="output folder (default benchmarks/out)")
    ap.add_argument("--only", help="comma-separated scenarios: micro,restore,checkpoint,memory,agg,pandas")
    ap.add_argument("--providers", help="comma-separated provider names (default: all that can run)")
    ap.add_argument("--sizes", help="override the micro/restore/memory sizes, e.g. 100000,1000000")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    console = Console(stderr=True)
    profile = QUICK if args.quick else FULL
    if args.xl and not args.quick:
        for lst in (profile.micro_sizes, profile.restore_sizes, profile.memory_sizes):
            lst.append(10_000_000)
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
        profile.micro_sizes = list(sizes)
        profile.restore_sizes = list(sizes)
        profile.memory_sizes = list(sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)

    console.log("compiling benchmarks/jvm/ProviderBench.java")
    jvm_bench.compile_harness()
    providers = all_providers()
    console.log("building the spark_state shim")
    shim_jar, why = spark_state_status(build=True)
    skipped = []
    if shim_jar is None:
        skipped.append(f"spark_state (both storages): not run — {why}")
        console.log(f"[yellow]spark_state not available:[/yellow] {why}")
        providers = [p for p in providers if not p.spark_state]
    if args.providers:
        wanted = set(args.providers.split(","))
        providers = [p for p in providers if p.name in wanted]
    else:   # the A/B variants (file format 1, no prestart, ArrowWriter only, encode at commit) run on request
        providers = [p for p in providers if p.name in PEERS + OURS]
    runner = Runner(args, profile, providers, shim_jar, console)
    runner.started = datetime.now().isoformat(timespec="seconds")
    runner.skipped.extend(skipped)
    meta = runner.run()
    shutil.rmtree(args.out / "work", ignore_errors=True)
    console.log(f"wrote {args.out / 'results.md'}, results.json and {', '.join(meta['charts'])}")
    if meta["skipped"]:
        console.log("[yellow]skipped/failed:[/yellow]\n  " + "\n  ".join(meta["skipped"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
