"""The user guide builds, with warnings as errors, and every example in it says whether it runs (no Spark)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import spark_state
from spark_state.options import PREFIX, documented
from tests.support import doc_examples
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_the_guide_builds_with_every_option_and_plot(site):
    configuration = (site / "configuration" / "index.html").read_text()
    for key, keyword, _ in documented():
        assert f"<code>{key[len(PREFIX):]}</code>" in configuration and f"<code>{keyword}</code>" in configuration
    assert {p.name for p in (site / "img").iterdir()} == {p.name for p in (ROOT / "benchmarks" / "results").glob("*.png")}
    assert "Source: <code>spark_state/format/datafile.py</code>" in (site / "format" / "index.html").read_text()


def test_every_example_runs_or_says_why_not():
    found = {page: doc_examples.examples(page) for page in doc_examples.pages()}
    every = [e for page in found.values() for e in page]
    assert len(every) > 10
    for example in every:
        if example.kind == "not-run":
            assert len(example.reason) > 20, f"{example.where}: say why it does not run, and what tests it instead"
        if example.lang == "python":
            compile(example.code, example.where, "exec")
    sandboxes = [e for e in every if e.kind == "sandbox"]
    assert [e.path.name for e in sandboxes] == ["README.md", "getting-started.md"]
    assert sandboxes[0].code == sandboxes[1].code, "the README's one-minute example and Getting started's differ"


def test_the_readmes_first_screen_says_what_how_to_install_and_how_to_turn_it_on():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:45])
    assert "state store for Spark Structured Streaming" in first_screen
    assert "pip install" in first_screen
    assert "spark_state.configure(" in first_screen


def test_file_names_in_the_docs_carry_the_current_version():
    for page in doc_examples.pages():
        for version in re.findall(r"spark_state-(\d+\.\d+\.\d+)", page.read_text()):
            assert version == spark_state.__version__, f"{page.name} names spark_state {version}"
