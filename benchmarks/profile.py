"""Profiles spark_state's commit and restore paths once: py-spy on the worker, JFR in the shim's JVM.

    python -m benchmarks.profile [--rows 1000000] [--storage filesystem] [--out benchmarks/out/profile]

Runs ProviderBench (benchmarks/jvm) for spark_state twice: `write` (load N rows,
then batches changing 10% of the keys: the commit path) and `restore` (a fresh
JVM and worker loading the latest version: the load path). Each JVM runs with
Java Flight Recorder on; py-spy records the worker the shim starts. Writes the
raw profiles (collapsed stacks, .jfr) and `profile.md` with the biggest costs
of each path, in the worker and in the JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks import jvm_bench
from benchmarks.providers import all_providers, spark_state_status

HERE = Path(__file__).resolve().parent
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _watch_worker(java: subprocess.Popen, out_file: Path, rate: int, found: dict) -> None:
    """Attaches py-spy to the spark_state worker as soon as the JVM starts it."""
    while java.poll() is None:
        for c in _children(java.pid):
            if "spark_state.worker" in _cmdline(c):
                found["pid"] = c
                found["proc"] = subprocess.Popen(
                    [PY_SPY, "record", "--pid", str(c), "--rate", str(rate), "--format", "raw",
                     "--output", str(out_file), "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=open(str(out_file) + ".log", "w"))
                return
        time.sleep(0.02)


def run_phase(provider, phase: str, rows: int, ckpt: Path, out: Path, shim_jar: Path, version: int | None,
              rate: int) -> dict:
    jfr = out / f"{phase}.jfr"
    raw = out / f"{phase}-worker.txt"
    cmd_extra = [f"-XX:StartFlightRecording=filename={jfr},settings=profile,dumponexit=true"]
    classes = jvm_bench.compile_harness()
    cp = os.pathsep.join([str(shim_jar), f"{jvm_bench.JARS}/*", str(classes)])
    cmd = ["java", f"-Xmx{jvm_bench.heap_for(rows)}", f"-Dlog4j2.configurationFile={jvm_bench.LOG4J}",
           *jvm_bench.JAVA_OPENS, *cmd_extra, "-cp", cp, "ProviderBench", "--provider-class", provider.cls,
           "--mode", phase, "--rows", str(rows), "--dir", str(ckpt), "--batches", "5"]
    if version is not None:
        cmd += ["--version", str(version)]
    for k, v in provider.sql_confs().items():
        if k != "spark.sql.streaming.stateStore.providerClass":
            cmd += ["--conf", f"{k}={v}"]
    log = open(out / f"{phase}.log", "w")
    java = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    found: dict = {}
    watcher = threading.Thread(target=_watch_worker, args=(java, raw, rate, found), daemon=True)
    watcher.start()
    stdout, _ = java.communicate()
    watcher.join(timeout=5)
    if "proc" in found:
        try:
            found["proc"].wait(timeout=30)
        except subprocess.TimeoutExpired:
            found["proc"].terminate()
    result = None
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    if result is None:
        raise RuntimeError(f"{phase} failed, see {out / (phase + '.log')}")
    result["worker_pid"] = found.get("pid")
    return result


# ------------------------------------------------------------------ analysis

def pyspy_top(raw: Path, roots: tuple[str, ...], n: int = 8) -> tuple[int, list, list]:
    """(samples under `roots`, top inclusive functions, top self functions) from py-spy raw output."""
    incl: Counter = Counter()
    self_: Counter = Counter()
    total = 0
    if not raw.exists():
        return 0, [], []
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        names = [f.split(" (")[0] + " (" + f.split(" (")[1].split("/")[-1] if " (" in f else f for f in frames]
        idx = next((i for i, f in enumerate(names) if any(r in f for r in roots)), None)
        if idx is None:
            continue
        c = int(count)
        total += c
        below = names[idx:]
        for f in set(below):
            incl[f] += c
        self_[below[-1]] += c
    return total, incl.most_common(n), self_.most_common(n)


def jfr_top(jfr: Path, roots: tuple[str, ...], n: int = 8) -> tuple[int, list, list]:
    """Same for a JFR recording: execution and native-method samples whose stack passes through `roots`."""
    if not jfr.exists() or shutil.which("jfr") is None:
        return 0, [], []
    proc = subprocess.run(["jfr", "print", "--json", "--stack-depth", "96", "--events",
                           "jdk.ExecutionSample,jdk.NativeMethodSample", str(jfr)],
                          capture_output=True, text=True)
    try:
        events = json.loads(proc.stdout)["recording"]["events"]
    except (ValueError, KeyError):
        return 0, [], []
    incl: Counter = Counter()
    self_: Counter = Counter()
    total = 0
    for ev in events:
        st = ev.get("values", {}).get("stackTrace") or {}
        frames = []
        for fr in st.get("frames", []):
            m = fr.get("method", {})
            cls = (m.get("type") or {}).get("name", "?").split(".")[-1]
            frames.append(f"{cls}.{m.get('name', '?')}")
        # frames are top (leaf) first
        idx = next((i for i, f in enumerate(frames) if any(r in f for r in roots)), None)
        if idx is None:
            continue
        total += 1
        below = frames[:idx + 1]
        for f in set(below):
            incl[f] += 1
        kind = " [native wait]" if ev.get("type") == "jdk.NativeMethodSample" else ""
        self_[below[0] + kind] += 1
    return total, incl.most_common(n), self_.most_common(n)


def _fmt(total: int, rows: list) -> list[str]:
    return [f"| {name} | {c} | {100 * c / total:.0f}% |" for name, c in rows] if total else ["| (no samples) | | |"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--storage", default="filesystem", choices=["filesystem", "memory"])
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "profile")
    args = ap.parse_args(argv)
    if not Path(PY_SPY).exists():
        sys.exit("py-spy not found: pip install py-spy")
    shim_jar, why = spark_state_status()
    if shim_jar is None:
        sys.exit(f"spark_state not available: {why}")
    provider = {p.name: p for p in all_providers()}["spark_state_fs" if args.storage == "filesystem"
                                                      else "spark_state_mem"]
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ckpt = out / "checkpoint"
    phases = ["write", "restore"] if args.storage == "filesystem" else ["write+restore"]
    results = {}
    version = None
    for phase in phases:
        print(f"profiling {phase} ({args.rows:,} rows) ...", file=sys.stderr)
        results[phase] = run_phase(provider, phase, args.rows, ckpt, out, shim_jar, version, args.rate)
        version = results[phase].get("version", version)
    shutil.rmtree(ckpt, ignore_errors=True)

    lines = [f"# spark_state profile ({args.rows:,} rows, {args.storage} storage)", ""]
    w = results[phases[0]]
    lines.append(f"Commit path: {len(w['commit_ms'])} commits (first = all rows new, then 10% changed): "
                 + ", ".join(f"{c:.0f}" for c in w["commit_ms"]) + " ms.")
    r = results[phases[-1]]
    lines.append(f"Restore path: getStore(latest) {r['restore_ms']:.0f} ms on a fresh provider "
                 f"({'new JVM and worker' if phase == 'restore' else 'same JVM'}).")
    lines.append("")
    sections = [
        ("Commit — worker (py-spy, samples under op_commit)", pyspy_top, phases[0] + "-worker.txt", ("op_commit",)),
        ("Commit — JVM (JFR, samples under SparkStateStore.commit)", jfr_top, phases[0] + ".jfr",
         ("SparkStateStore.commit",)),
        ("Restore — worker (py-spy, samples under op_load)", pyspy_top, phases[-1] + "-worker.txt", ("op_load",)),
        ("Restore — JVM (JFR, samples under SparkStateProvider.getStore / getReadStore)", jfr_top,
         phases[-1] + ".jfr", ("SparkStateProvider.getStore", "SparkStateProvider.getReadStore")),
    ]
    summary = {}
    for title, fn, fname, roots in sections:
        total, incl, self_ = fn(out / fname, roots)
        summary[title] = {"samples": total, "inclusive": incl, "self": self_}
        lines += [f"## {title}", "", f"{total} samples.", "", "Self (where the time is spent):", "",
                  "| function | samples | share |", "|---|---|---|", *_fmt(total, self_), "",
                  "Inclusive:", "", "| function | samples | share |", "|---|---|---|", *_fmt(total, incl), ""]
    (out / "profile.md").write_text("\n".join(lines))
    (out / "profile.json").write_text(json.dumps({"results": results, "summary": summary}, indent=1))
    print((out / "profile.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
