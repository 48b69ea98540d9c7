"""What a new user runs first stays light: ``make demo`` installs spark_state without the extras of the tests,
benchmarks, docs and releases; the one-minute example picks a partition count instead of Spark's 200."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import doc_examples
from tests.support.paths import ROOT


def test_make_demo_installs_spark_state_without_extras(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    done = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installs = [line for line in done.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs, done.stdout
    assert not [line for line in installs if "[" in line], f"make demo installs extras: {installs}"
    assert "spark_state.demo" in done.stdout


def test_the_one_minute_example_sets_a_partition_count():
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        [example] = [e for e in doc_examples.examples(page) if e.kind == "sandbox"]
        assert '.config("spark.sql.shuffle.partitions", 4)' in example.code, page.name
