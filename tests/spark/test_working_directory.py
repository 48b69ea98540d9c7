"""Nothing in the working directory of a Spark application or of ``spark-state`` shadows a package: the state
worker, and the Python workers of ``spark-state migrate``, import the installed spark_state even beside a
``spark_state/`` directory; a worker Python that cannot import spark_state fails in one line that says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import doc_examples
from tests.support.paths import FIXTURES, ROOT, pythonpath_with_root

pytestmark = pytest.mark.spark_state_only("the state worker of spark_state")

SHADOW = 'raise ImportError("the spark_state/ directory of the working directory shadowed the installed package")\n'
SPARK_STATE_CKPT = FIXTURES / "format1" / "pandas" / "ckpt-test"
HDFS_CKPT = FIXTURES / "format1" / "pandas" / "ckpt-hdfs"


def _beside_a_spark_state_directory(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "spark_state").mkdir(parents=True)
    (work / "spark_state" / "__init__.py").write_text(SHADOW)
    return work


def _run(cmd: list, cwd: Path, **env) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=pythonpath_with_root(), **env)
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def _spark_state_script() -> Path:
    """The console script users run: it imports spark_state from its environment, never from the working directory."""
    script = Path(sys.executable).parent / "spark-state"
    assert script.exists(), f"{script}: install spark_state into this environment (make install)"
    return script


def test_the_one_minute_example_runs_beside_a_spark_state_directory(tmp_path):
    """A real application (the README's example, as a script) whose driver's working directory holds a
    spark_state/ directory: the state worker its JVM starts there still imports the installed package."""
    [example] = [e for e in doc_examples.examples(ROOT / "README.md") if e.kind == "sandbox"]
    app = tmp_path / "app" / "clicks.py"
    app.parent.mkdir()
    app.write_text(example.code)
    work = _beside_a_spark_state_directory(tmp_path)
    done = _run([sys.executable, app], work, PYSPARK_PYTHON=sys.executable)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "ckpt" / "state" / "0" / "0").is_dir()


def test_spark_state_migrate_runs_beside_a_spark_state_directory(tmp_path):
    """migrate starts a local Spark whose Python workers (the spark_state writer) and state worker (the
    check that reads the target back) would import from the working directory."""
    work = _beside_a_spark_state_directory(tmp_path)
    shutil.copytree(HDFS_CKPT, work / "ckpt")
    done = _run([_spark_state_script(), "migrate", "ckpt", "migrated", "--no-progress"], work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "migrated batch 3" in done.stdout and (work / "migrated" / "metadata").exists()


def test_a_worker_python_that_cannot_import_spark_state_fails_in_one_line(tmp_path):
    """The state worker's Python finds another spark_state first (here on its PYTHONPATH): the task fails with
    one line that names it, and spark-state prints that line, no traceback."""
    elsewhere = _beside_a_spark_state_directory(tmp_path / "elsewhere")
    python = tmp_path / "python-with-another-spark-state"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={elsewhere} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    shutil.copytree(SPARK_STATE_CKPT, tmp_path / "ckpt")
    done = _run([_spark_state_script(), "migrate", "ckpt", "migrated", "--to", "hdfs", "--no-progress",
                 "--conf", f"python={python}"], tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "\tat " not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"spark-state migrate: error: spark_state: the state worker's Python '{python}'"), last
    assert "cannot import spark_state.worker (ImportError: the spark_state/ directory" in last, last
    assert f"spark_state found at {elsewhere}/spark_state/__init__.py" in last, last
    assert not (tmp_path / "migrated").exists()
