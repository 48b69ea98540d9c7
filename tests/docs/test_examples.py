"""Every runnable example of README.md and docs/*.md runs, on the suite's SparkSession (tests/support/doc_examples.py).

The one-minute example runs once and leaves its checkpoint in a sandbox directory; each page's examples
then run in order in a copy of it, so a renamed option, function or command fails here.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support import doc_examples

pytestmark = pytest.mark.spark_state_only("runs spark_state's documented examples")

PAGES = [p for p in doc_examples.pages() if any(e.kind == "run" for e in doc_examples.examples(p))]


@pytest.fixture(scope="module")
def sandbox(spark, tmp_path_factory):
    """The directory the one-minute example ran in (its checkpoint in ckpt/)."""
    [example] = [e for e in doc_examples.examples(doc_examples.ROOT / "README.md") if e.kind == "sandbox"]
    work = tmp_path_factory.mktemp("docs-sandbox")
    before = dict(spark.conf.getAll)
    try:
        doc_examples.run(example, {"__name__": "__docs__"}, work)
    finally:   # its builder's settings (a partition count) land on the suite's session: not beyond the example
        for key, value in dict(spark.conf.getAll).items():
            if before.get(key) != value:
                spark.conf.unset(key) if key not in before else spark.conf.set(key, before[key])
    return work


def test_the_one_minute_example_runs_with_the_partition_count_it_sets(sandbox):
    from spark_state.spark.checkpoint import SparkCheckpoint

    assert SparkCheckpoint(str(sandbox / "ckpt")).num_partitions(0) == 4


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_examples_of_the_page_run(page, sandbox, tmp_path):
    work = tmp_path / "sandbox"
    shutil.copytree(sandbox, work)
    namespace = {"__name__": "__docs__"}
    for example in doc_examples.examples(page):
        if example.kind == "run":
            doc_examples.run(example, namespace, work)
