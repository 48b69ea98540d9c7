"""The main job: per-user click sessions with applyInPandasWithState on spark_state.

It runs the same streaming query as two separate Spark applications (two
processes, two JVMs): the first reads the first half of a generated click
stream and stops; the second restarts from the same checkpointLocation, reads
the second half, and shows that every user's running totals continue from
where the first left them and that sessions time out on event time.

    python -m spark_state.demo [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

USERS = [f"user{i:02d}" for i in range(12)]
START = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
SESSION_GAP = timedelta(minutes=30)
OUTPUT_SCHEMA = "user string, clicks long, sessions long, session_clicks long, status string"
STATE_SCHEMA = "clicks long, sessions long, session_clicks long, last_ts long"


def generate_events(workdir: Path) -> list[list[dict]]:
    """Four files of click events; users go quiet so their sessions time out in the second half."""
    rng = random.Random(7)
    files = []
    for batch in range(4):
        events = []
        active = USERS if batch < 2 else USERS[: len(USERS) // 2]
        for user in active:
            for _ in range(rng.randint(1, 4)):
                minute = batch * 40 + rng.randint(0, 9)
                ts = START + timedelta(minutes=minute)
                events.append({"user": user, "ts": ts.isoformat(), "page": f"/p{rng.randint(1, 5)}"})
        files.append(events)
        path = workdir / "events" / f"part-{batch}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return files


def track_sessions(key, pdfs, state):
    """Counts clicks per user across restarts; a session closes after 30 quiet minutes of event time."""
    import pandas as pd

    (user,) = key
    if state.hasTimedOut:
        clicks, sessions, session_clicks, last_ts = state.get
        state.update((clicks, sessions, 0, last_ts))
        yield pd.DataFrame([{"user": user, "clicks": clicks, "sessions": sessions,
                             "session_clicks": session_clicks, "status": "closed"}])
        return
    clicks, sessions, session_clicks, last_ts = state.get if state.exists else (0, 0, 0, 0)
    for pdf in pdfs:
        n = len(pdf)
        if session_clicks == 0:
            sessions += 1
        clicks += n
        session_clicks += n
        last_ts = max(last_ts, int(pdf["ts"].max().timestamp() * 1000))
    state.update((clicks, sessions, session_clicks, last_ts))
    state.setTimeoutTimestamp(last_ts + int(SESSION_GAP.total_seconds() * 1000))
    yield pd.DataFrame([{"user": user, "clicks": clicks, "sessions": sessions,
                         "session_clicks": session_clicks, "status": "open"}])


def run_phase(workdir: Path, phase: int) -> None:
    """One Spark application: process the files present, print the output, stop."""
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.state import GroupStateTimeout

    import spark_state

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # pandas UDFs need this venv's pyarrow
    log4j = Path(__file__).resolve().parent.parent / "conf" / "log4j2.properties"
    builder = (
        SparkSession.builder.master("local[2]").appName(f"spark_state demo, run {phase}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
    )
    spark = spark_state.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    events = (
        spark.readStream.schema("user string, ts timestamp, page string")
        .option("maxFilesPerTrigger", 1).json(str(workdir / "events"))
    )
    sessions = (
        events.withWatermark("ts", "10 minutes").groupBy("user")
        .applyInPandasWithState(track_sessions, OUTPUT_SCHEMA, STATE_SCHEMA, "update",
                                GroupStateTimeout.EventTimeTimeout)
    )
    out_dir = workdir / f"output-{phase}"
    out_dir.mkdir(parents=True, exist_ok=True)

    def collect(df, batch_id):
        rows = [r.asDict() for r in df.collect()]
        (out_dir / f"batch-{batch_id}.json").write_text(json.dumps(rows))

    query = (
        sessions.writeStream.foreachBatch(collect).outputMode("update")
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    spark.stop()


def _outputs(workdir: Path, phase: int) -> list[tuple[int, list[dict]]]:
    out = []
    for f in sorted((workdir / f"output-{phase}").glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        out.append((int(f.stem.split("-")[1]), json.loads(f.read_text())))
    return out


def _expected_clicks(files: list[list[dict]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for events in files:
        for e in events:
            totals[e["user"]] = totals.get(e["user"], 0) + 1
    return totals


def _cli_command() -> str:
    """How to run spark-state from here: the script beside this Python (a venv not activated), else the module."""
    script = Path(sys.executable).parent / "spark-state"
    if shutil.which("spark-state") == str(script):
        return "spark-state"
    return str(script) if script.exists() else f"{sys.executable} -m spark_state"


def _show_state_without_spark(console, workdir: Path, final: dict) -> bool:
    """The state files are typed tables: read them back with pandas (no Spark, no JVM) and check each user's
    stored click count equals the query's last output for that user."""
    import spark_state

    state = spark_state.read_state(str(workdir / "checkpoint")).to_pandas()
    stored = {row["key"]["user"]: row["value"]["groupState"] for _, row in state.iterrows()}
    console.print("\nthe same state read without Spark: [bold]spark_state.read_state(checkpoint).to_pandas()[/bold]")
    console.print(state.head(3).to_string(), markup=False, soft_wrap=True)
    if len(state) > 3:
        console.print(f"... the first 3 of {len(state)} rows")
    wrong = {u: (s["clicks"], final.get(u, {}).get("clicks")) for u, s in stored.items()
             if s["clicks"] != final.get(u, {}).get("clicks")}
    if wrong or sorted(stored) != sorted(final):
        console.print(f"[red]stored state differs from the output[/red] (user: stored, output): {wrong}; "
                      f"users stored {sorted(stored)}, output {sorted(final)}")
        return False
    console.print(f"{len(stored)} users' stored click counts equal the query's output.")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_state.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where events, checkpoint and outputs go (default: a new temp dir)")
    parser.add_argument("--phase", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.phase is not None:
        run_phase(args.workdir, args.phase)
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark-state-demo-"))
    if (workdir / "checkpoint").exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    files = generate_events(workdir)
    staged = workdir / "staged"
    staged.mkdir(exist_ok=True)
    for name in ("part-2.json", "part-3.json"):  # the second half arrives after the restart
        shutil.move(str(workdir / "events" / name), str(staged / name))

    def child(phase: int) -> None:
        cmd = [sys.executable, "-m", "spark_state.demo", "--phase", str(phase),
               "--workdir", str(workdir)]
        with console.status(f"run {phase}: a fresh Spark application processes the stream…"):
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log = workdir / f"run-{phase}.log"
            log.write_text(proc.stdout + proc.stderr)
            # the cause, not the stack trace around it: spark_state's messages start with "spark_state:"
            lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
            cause = next((line for line in lines if "spark_state:" in line or "SparkStateError" in line),
                         lines[-1] if lines else "no output")
            raise SystemExit(f"run {phase} failed (exit {proc.returncode}): {cause}\nits whole output: {log}")

    console.rule("[bold]spark_state demo: applyInPandasWithState, stopped and restarted")
    console.print(f"work dir: {workdir}\n")
    child(1)
    after_first = {}
    for batch, rows in _outputs(workdir, 1):
        for r in rows:
            after_first[r["user"]] = r
    console.print(f"run 1 processed batches {[b for b, _ in _outputs(workdir, 1)]} and stopped.")

    for f in staged.iterdir():
        shutil.move(str(f), str(workdir / "events" / f.name))
    child(2)
    final, closed = {}, set()
    for batch, rows in _outputs(workdir, 2):
        for r in rows:
            final[r["user"]] = r
            if r["status"] == "closed":
                closed.add(r["user"])

    expected = _expected_clicks(files)
    table = Table(title="Running totals: state from run 1 continues in run 2")
    for col in ("user", "clicks after run 1", "new clicks in run 2", "clicks after run 2", "expected", "session"):
        table.add_column(col)
    ok = True
    second_half = _expected_clicks(files[2:])
    for user in USERS:
        before = after_first.get(user, {}).get("clicks", 0)
        after = final.get(user, {}).get("clicks", before)
        good = after == expected[user]
        ok &= good
        table.add_row(user, str(before), str(second_half.get(user, 0)), str(after),
                      str(expected[user]) + ("" if good else "  MISMATCH"),
                      "timed out" if user in closed else "open")
    console.print(table)
    store = workdir / "checkpoint" / "state" / "0" / "0"
    ours = sorted(p for p in store.rglob("*") if p.is_file() and p.parent.name != "_metadata")
    console.print(f"\ncheckpoint: {workdir / 'checkpoint'}\nspark_state files of operator 0, partition 0 "
                  "(manifests chk-N/_metadata, Arrow data in shared/):")
    for p in ours:
        console.print(f"  {p.relative_to(workdir)}  ({p.stat().st_size} bytes)", markup=False, soft_wrap=True)
    ok &= _show_state_without_spark(console, workdir, final)
    if not closed:
        ok = False
        console.print("[red]no session timed out in run 2, but the quiet users' sessions should have")
    if ok:
        console.print(f"\n[green]OK[/green]: every user's total after the restart equals all clicks of both runs; "
                      f"{len(closed)} quiet users' sessions timed out on event time after the restart.")
        cli = _cli_command()
        console.print(f"The work dir stays; look around its checkpoint with `{cli} ls {workdir / 'checkpoint'}` "
                      f"(`{cli} --help` lists what else it does).", markup=False, soft_wrap=True)
        return 0
    console.print("\n[red]FAILED[/red]: state did not come back exactly")
    return 1


if __name__ == "__main__":
    sys.exit(main())
