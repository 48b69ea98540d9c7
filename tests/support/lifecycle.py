"""Helpers of the lifecycle tests (savepoint, restore, rescale, CLI): a finished checkpoint shared
by the tests that only read it, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT, pythonpath_with_root
from tests.support.running_total import PHASES, SCHEMA, build_query
from tests.support.spark import JsonStream, Query
from tests.support.waiting import wait_until_settled

_FINISHED: dict = {}


@dataclass
class Finished:
    """A spark_state query (applyInPandasWithState, event-time timeouts) that ran 4 batches and stopped."""

    query: Query
    events: JsonStream

    @property
    def checkpoint(self) -> Path:
        return self.query.checkpoint

    def copy(self, to: Path) -> Path:
        """A private copy of the checkpoint for a test that changes or breaks it."""
        shutil.copytree(self.checkpoint, to)
        return to

    def query_on(self, checkpoint: Path) -> Query:
        """The same query (same input files) on another checkpoint location."""
        return Query(self.query.spark, self.query.build, checkpoint, mode="update")


def finished_checkpoint(spark, tmp_path_factory) -> Finished:
    """Runs the query once per test session; tests that change the checkpoint must copy() it."""
    if "finished" not in _FINISHED:
        base = tmp_path_factory.mktemp("finished")
        events = JsonStream(base / "events", SCHEMA)
        for rows in PHASES[0] + PHASES[1]:
            events.add(rows)
        query = Query(spark, build_query(events, "EventTimeTimeout", "update"), base / "ckpt", mode="update")
        query.run()
        wait_until_settled(query.checkpoint)   # tests copy it file by file; the last maintenance run first
        _FINISHED["finished"] = Finished(query, events)
    return _FINISHED["finished"]


def cli(*args: str, check: bool = True, timeout: float = 180, env: dict | None = None,
        capabilities: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m spark_state ARGS`` in a child process (what the ``spark-state`` script runs), in `env` (default:
    this one's); run as root, the child gives up `capabilities` (``setpriv`` options)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = pythonpath_with_root(env)
    setpriv = ["setpriv", *capabilities] if capabilities and os.geteuid() == 0 else []
    done = subprocess.run([*setpriv, sys.executable, "-m", "spark_state", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"spark-state {' '.join(map(str, args))} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def cli_json(*args: str, check: bool = True, **kwargs) -> tuple[int, dict]:
    done = cli(*args, "--json", check=check, **kwargs)
    return done.returncode, json.loads(done.stdout)
