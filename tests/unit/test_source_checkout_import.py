"""The venv ``make demo`` / ``make install`` builds imports the real spark_state from any working directory: a
clone named ``spark_state/`` seen from its parent (no ``__init__.py`` at its top) must not become an empty
namespace package (setuptools' editable finder runs after Python's path finder, which takes the directory as a
namespace portion). Without PYTHONPATH, as a user runs ``python app.py`` or ``python -m spark_state``."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import ROOT


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_clone_named_spark_state_in_the_working_directory_does_not_hide_the_package(tmp_path):
    clone = tmp_path / "spark_state"            # what `git clone ... spark_state` leaves in the directory
    (clone / "spark_state").mkdir(parents=True)
    (clone / "README.md").write_text("a clone\n")
    done = subprocess.run([sys.executable, "-c", "import spark_state; print(spark_state.__file__); "
                           "spark_state.configure"], cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(ROOT / "spark_state" / "__init__.py") or "site-packages" in done.stdout


def test_python_m_spark_state_runs_from_the_parent_of_a_clone_named_spark_state(tmp_path):
    (tmp_path / "spark_state" / "spark_state").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "spark_state", "ls", str(tmp_path / "nothing")], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "does not exist" in done.stderr
