"""Compatibility matrix: the wheel on each supported Python beside each supported pyspark, no JDK at run time.

    python -m tests.compat.run [--matrix 3.10=4.0.5 3.12=4.1.4 3.13=4.2.1] [--python 3.12=/path/to/python3.12]
                               [--wheel PATH] [--workdir DIR]

Not the full product: every supported Python and every supported pyspark at least once, the
development environment (Python 3.11, pyspark 4.3: the suite and tests/packaging/test_wheel.py)
included. For each entry: a fresh virtualenv of that Python (tests/support/pythons.py finds the
interpreter) with the wheel and ``pyspark==VERSION`` installed by pip (every dependency resolved
for that Python and installed from the index or pip's cache, nothing shared with the development
environment), then tests/support/wheel_app.py twice with ``java`` but no ``javac`` on PATH: a
running-total applyInPandasWithState query, stopped and restarted from its checkpoint in a second
application, must continue every key's total, and the provider-contract check (no abstract method
of that version's StateStoreProvider / StateStore / ReadStateStore left unimplemented by the shim
classes, loaded in that version's JVM) must come back empty, and in the second application Spark's
change feed, snapshot replay and read_changes must agree (``history_problems``). Each application
runs the query twice, from two checkpoints: with checkpoint format v1 and with Spark's checkpoint
format v2 (state store checkpoint ids), which must give the same totals and history, and whose commit
log must name the checkpoint ids (v1's none).
Prints one line per entry with the measured times; exits 1 if any entry failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tests.support import pythons, quick_jvm, wheel_app, wheel_env

#: Python -> pyspark (latest patch release of each minor version besides the development pin, 4.3 on
#: Python 3.11). Python 3.10 goes with pyspark 4.0, the oldest pair both support; pyspark 4.3 supports
#: Python 3.11-3.14 and 4.0-4.2 support 3.10-3.13.
DEFAULT_MATRIX = {"3.10": "4.0.5", "3.12": "4.1.4", "3.13": "4.2.1"}


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in items if "=" in item)
    if len(pairs) != len(items):
        raise SystemExit(f"{what}: expected PYTHON=VALUE items, e.g. 3.12=4.1.4; got {items}")
    return pairs


def install(wheel: Path, python_version: str, version: str, work: Path, explicit: str | None) -> tuple[Path, float]:
    """A fresh venv of Python ``python_version`` with the wheel and ``pyspark==version``; returns its python
    and the seconds it took."""
    t0 = time.monotonic()
    python = wheel_env.make_venv(work / "venv", base=pythons.find(python_version, explicit))
    wheel_env.pip_install(python, wheel, f"pyspark=={version}", log=work / "pip.log")
    return python, round(time.monotonic() - t0, 1)


def history_problems(phase: int, history: dict | None) -> list[str]:
    """What is wrong with the state's history an app reported: Spark's change feed must list one update per key
    each batch changed and be what read_changes returns; snapshot replay must rebuild the state Spark reads."""
    if phase < 2:
        return []
    if not history:
        return [f"phase {phase} reported no history"]
    problems = []
    feed = [json.loads(r) for r in history["feed"]]
    changed = sorted((r["batch_id"], r["key"]["k"], r["change_type"]) for r in feed)
    expected = sorted((p - 1, k, "update") for p in range(1, phase + 1) for k in {k for k, _ in wheel_app.EVENTS[p]})
    if changed != expected:
        problems.append(f"change feed lists {changed}, expected {expected}")
    if history["read_changes"] != history["feed"]:
        problems.append(f"read_changes {history['read_changes']} is not the change feed {history['feed']}")
    if history["replayed"] != history["state"] or not history["state"]:
        problems.append(f"snapshot replay gave {history['replayed']}, the state is {history['state']}")
    return problems


def check_version(installing: Future, python_version: str, version: str, work: Path) -> dict:
    """Runs one entry once its venv is installed; returns its record (``ok``, ``error``, times in seconds)."""
    record: dict = {"python": python_version, "pyspark": version, "ok": False}
    t0 = time.monotonic()
    try:
        python, record["install_s"] = installing.result()
        t0 = time.monotonic()
        env = wheel_env.jre_env(work)
        # the query as it comes (format v1) and with Spark's checkpoint format v2 (state store checkpoint ids),
        # each on a checkpoint of its own, in one application per phase (one JVM start checks both formats)
        runs = []
        for phase in (1, 2):
            t = time.monotonic()
            runs.append(wheel_env.run_app(python, work / "app", phase, env,
                                          args=["--configure", "--checkpoint-format", "1", "2"]))
            record[f"phase{phase}_s"] = round(time.monotonic() - t, 1)
        problems = []
        for fmt in ("1", "2"):
            for phase, run in enumerate(runs, start=1):
                result, where = run["queries"][fmt], f"checkpoint format v{fmt}, phase {phase}"
                expected = {k: v for k, v in wheel_app.expected_totals(phase).items()
                            if k in {k for k, _ in wheel_app.EVENTS[phase]}}
                if result["totals"] != expected:
                    problems.append(f"{where}: totals {result['totals']}, expected {expected}")
                if result["pythons"] != [str(python)]:
                    problems.append(f"{where}: the UDF ran on {result['pythons']}, not {python}")
                if bool(result["unique_ids"]) != (fmt == "2"):   # v2 names its checkpoint ids, v1 none
                    problems.append(f"{where}: the commit log's checkpoint ids are {result['unique_ids']}")
                problems += [f"{where}: {p}" for p in history_problems(phase, result.get("history"))]
        for phase, result in enumerate(runs, start=1):
            if result["spark"] != version:
                problems.append(f"phase {phase} ran Spark {result['spark']}, not {version}")
            if result["python_version"] != python_version:
                problems.append(f"phase {phase} ran Python {result['python_version']}, not {python_version}")
            if result["javac"]:
                problems.append(f"javac was on PATH: {result['javac']}")
            if not result["jar"].startswith(str(work / "venv")):
                problems.append(f"the shim jar {result['jar']} is not the installed wheel's")
            if "io.sparkstate.shim.MaintenanceWarnings" not in result["listeners"]:
                problems.append(f"phase {phase}: spark_state's query listener is not registered: {result['listeners']}")
            unimplemented = {c: m for c, m in result["contract"].items() if m}
            if unimplemented:
                problems.append(f"abstract methods left unimplemented: {unimplemented}")
        record["ok"] = not problems
        record["error"] = "; ".join(problems) or None
    except (wheel_env.AppFailed, pythons.PythonNotFound) as err:
        record["error"] = str(err)
    record["total_s"] = round(record.get("install_s", 0) + time.monotonic() - t0, 1)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", nargs="+", metavar="PYTHON=PYSPARK",
                        default=[f"{py}={spark}" for py, spark in DEFAULT_MATRIX.items()],
                        help="the entries to run (default: %(default)s)")
    parser.add_argument("--python", action="append", default=[], metavar="PYTHON=PATH",
                        help="the interpreter of a Python version, when it is not found by itself")
    parser.add_argument("--wheel", type=Path, help="an already built wheel (default: build one)")
    parser.add_argument("--workdir", type=Path, help="keep venvs and logs here (default: a temporary dir)")
    args = parser.parse_args(argv)
    matrix = _pairs(args.matrix, "--matrix")
    explicit = _pairs(args.python, "--python")

    quick_jvm.install()   # the apps' JVMs: C1 alone, as in the suite
    work = args.workdir or Path(tempfile.mkdtemp(prefix="spark-state-compat-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    wheel = args.wheel
    if wheel is None:
        t = time.monotonic()
        wheel = wheel_env.build_wheel(work / "dist")
        print(f"built {wheel.name} in {time.monotonic() - t:.1f} s", flush=True)
    records = []
    # pip is mostly waiting on disk and the index: every venv installs at once, the apps (which start
    # Spark) then run one version at a time.
    with ThreadPoolExecutor(max_workers=len(matrix)) as pool:
        installs = {py: pool.submit(install, wheel, py, spark, work / f"py{py}-pyspark-{spark}", explicit.get(py))
                    for py, spark in matrix.items()}
        for py, spark in matrix.items():
            record = check_version(installs[py], py, spark, work / f"py{py}-pyspark-{spark}")
            records.append(record)
            times = ", ".join(f"{k} {v} s" for k, v in record.items() if k.endswith("_s"))
            status = "ok" if record["ok"] else "FAILED: " + record["error"]
            print(f"Python {py}, pyspark {spark}: {status} ({times})", flush=True)
    (work / "results.json").write_text(json.dumps(records, indent=2))
    print(f"compat matrix done in {time.monotonic() - started:.0f} s (logs and results.json in {work})")
    print(f"compat: {sum(r['ok'] for r in records)} passed, {sum(not r['ok'] for r in records)} failed", flush=True)
    if args.workdir is None and all(r["ok"] for r in records):
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
