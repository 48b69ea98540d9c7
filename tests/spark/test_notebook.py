"""A notebook's order of events: a plain SparkSession first, spark_state configured afterwards."""

from __future__ import annotations

import json
import os
import sys

from tests.support import wheel_env
from tests.support.paths import ROOT


def run_child(tmp_path, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    out = wheel_env.run([sys.executable, "-m", "tests.support.notebook_child", tmp_path, mode],
                        log=tmp_path / f"{mode}.log", env=env, cwd=ROOT, timeout=300)
    line = next(line for line in reversed(out.splitlines()) if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_configure_after_a_plain_session_in_the_same_process_works(tmp_path):
    result = run_child(tmp_path, "works")
    # The second query restarted from the checkpoint: a's count continues from the first run.
    assert result["counts"] == [{"a": 2, "b": 1}, {"a": 3, "b": 1, "c": 1}]
    assert result["manifests"] > 0, "the state was not written by spark_state"


def test_a_driver_that_cannot_take_the_jar_fails_at_get_or_create_saying_what_to_do(tmp_path):
    error = run_child(tmp_path, "foreign-loader")["error"]
    assert error is not None
    assert "restart the Python process" in error and "before the first SparkSession" in error
    assert "--jars" in error and "ClassNotFoundException" in error
