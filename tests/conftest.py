"""Shared fixtures: one SparkSession for the whole run, the provider under test, slow tests; the markers
that say what a test needs.

Layout (helpers live in tests/support, never in a test module):
  tests/unit, tests/chain, tests/worker   no SparkSession, no JVM (``make test-fast``; unit + chain take 20-30 s)
  tests/jvm                               a JDK only (probes of the shim's classes): marked ``jvm``
  tests/spark, tests/packaging            a SparkSession (or a Spark application in a child): marked ``spark``
  tests/cluster                           two executors, in a pytest process of its own (``make test-cluster``)

A test elsewhere that asks for a SparkSession fixture is marked ``spark`` too; one in the fast directories
is refused at collection (move it to tests/spark), so ``-m "not spark and not jvm"`` never starts Spark.

``make test`` runs this suite on two pytest-xdist workers (``-n 2 --dist loadgroup``): the tests that use the
SparkSession on one (one session for the run), the rest beside them (``_group``). Plain ``pytest`` runs
everything in one process.

Options:
  --run-slow                     also run tests marked ``slow``
  --tested-provider=hdfs         run the end-to-end tests with Spark's HDFS provider on
                                 both sides (validates the harness without the shim);
                                 default ``spark_state`` (env SPARK_STATE_TESTED)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from tests.support import quick_jvm, s3_server

# CI (.ci/run sets HYPOTHESIS_PROFILE=ci) runs the property tests on examples derived from each test, the
# same on every run: a landing never hangs on what one run's random draw happened to find. Plain pytest and
# `make test-fast` keep drawing new examples, which is where new failures are found (then kept as @example).
hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The loopback S3 endpoint's address (no server yet: tests start it) must be in the environment before the
# Spark JVM starts: the JVM passes it on to the spark_state worker it starts. A pytest-xdist worker inherits
# its controller's environment, so each worker chooses a port of its own (each runs its own server).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("SPARK_STATE_TEST_S3_PORT", None)
os.environ.update(s3_server.endpoint_env())

# The tests' JVMs (their SparkSession, child applications, probes) compile with C1 alone: about half the CPU
# of a short-lived JVM on a suite that is CPU-bound (tests/support/quick_jvm.py).
quick_jvm.install()

TESTS = Path(__file__).parent
#: What the tests of each directory need, by marker.
NEEDS = {"spark": "spark", "packaging": "spark", "cluster": "spark", "jvm": "jvm"}
#: Directories whose tests run without Spark or a JVM.
FAST = ("unit", "chain", "worker")
#: Fixtures that start (or are) a SparkSession.
SPARK_FIXTURES = {"spark", "make_twin", "scenario_run", "finished", "cluster"}


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")
    parser.addoption("--tested-provider", choices=("spark_state", "hdfs"),
                     default=os.environ.get("SPARK_STATE_TESTED", "spark_state"),
                     help="state store provider the end-to-end tests check against the HDFS reference")


def pytest_ignore_collect(collection_path, config):
    """tests/cluster runs in a pytest process of its own (``pytest tests/cluster``): it needs its own
    SparkSession (local-cluster), and a Python process holds one SparkContext."""
    cluster = TESTS / "cluster"
    if collection_path == cluster:
        asked = [Path(str(a).split("::")[0]).resolve() for a in config.args]
        return not any(a == cluster or cluster in a.parents for a in asked)
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    grouping = getattr(config.option, "loadgroup", False)   # on a pytest-xdist worker under --dist loadgroup
    for item in items:
        _mark_needs(item)
        if grouping:
            _group(item)
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _mark_needs(item) -> None:
    """Marks ``spark`` / ``jvm`` from the test's directory and fixtures; refuses either in a fast directory."""
    path = Path(item.path)
    top = path.relative_to(TESTS).parts[0] if TESTS in path.parents else ""
    need = NEEDS.get(top)
    if need is None and SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
        need = "spark"
    if need is not None:
        item.add_marker(need)
    if top in FAST and (need or item.get_closest_marker("spark") or item.get_closest_marker("jvm")):
        raise pytest.UsageError(f"{item.nodeid} needs Spark or a JVM, but tests/{top} runs without them: "
                                f"move it to tests/spark or tests/jvm")


def _group(item) -> None:
    """Under ``pytest -n 2 --dist loadgroup`` (``make test``) the tests that use the suite's SparkSession run on
    one worker (one session for the run), as do the JVM probes and the users of the session's wheel (built
    once); every other test, those that start Spark applications of their own included, runs on whichever
    worker is free."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if SPARK_FIXTURES & fixtures:
        group = "spark"
    elif "wheel" in fixtures:
        group = "wheel"
    elif item.get_closest_marker("jvm") is not None:
        group = "jvm"
    else:
        return
    item.add_marker(pytest.mark.xdist_group(group))


UNGROUPED = pytest.StashKey[str]()


def pytest_collection_finish(session):
    """Notices a run on pytest-xdist workers whose grouping failed: its Spark tests would start a SparkSession on
    every worker. pytest-xdist marks a grouped test by a suffix of its id; each test it did not fails at once."""
    if not getattr(session.config.option, "loadgroup", False):   # set on pytest-xdist's workers
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if ungrouped:
        import xdist

        session.config.stash[UNGROUPED] = (
            f"pytest-xdist {xdist.__version__} did not group {len(ungrouped)} tests under --dist loadgroup with "
            f"pytest {pytest.__version__}: install the pytest the test extra pins (pip install -e '.[test]') "
            "or run without -n")


def pytest_runtest_setup(item):
    """``spark_state_only``: the test checks spark_state's own tools (there is nothing to compare on HDFS)."""
    ungrouped = item.config.stash.get(UNGROUPED, None)
    if ungrouped is not None and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(ungrouped, pytrace=False)
    only = item.get_closest_marker("spark_state_only")
    if only is not None and item.config.getoption("--tested-provider") != "spark_state":
        pytest.skip(only.args[0] if only.args else "checks spark_state itself")


@pytest.fixture(scope="session")
def tested(pytestconfig) -> str:
    """The provider under test: "spark_state" (default) or "hdfs" (harness check)."""
    return pytestconfig.getoption("--tested-provider")


@pytest.fixture(scope="session")
def spark(tested):
    """One SparkSession (local[2], 2 shuffle partitions) for every end-to-end test."""
    from tests.support.spark import spark_builder

    builder = spark_builder()
    if tested == "spark_state":
        import spark_state

        builder = spark_state.configure(builder, storage="filesystem")
    with quick_jvm.long_lived():   # it runs every SparkSession test: C2 pays for itself there
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def make_twin(spark, tested, tmp_path):
    """make_twin(build, mode=..., options=..., conf=...) -> streaming.Twin in this test's tmp dir."""
    from tests.support.spark import Twin

    count = 0

    def make(build, **kwargs):
        nonlocal count
        count += 1
        return Twin(spark, tmp_path / f"twin{count}", build, tested=tested, **kwargs)

    return make


@pytest.fixture(scope="session")
def scenario_run(spark, tested, tmp_path_factory):
    """scenario_run(name) -> the finished Twin of scenarios.SCENARIOS[name], run once per session.

    Spark's refusal of a query is cached too and raised again on every call.
    """
    from tests.support.scenarios import SCENARIOS, run_scenario

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            try:
                cache[name] = run_scenario(spark, tmp_path_factory.mktemp(name), SCENARIOS[name], tested=tested)
            except Exception as err:  # noqa: BLE001 - replayed to every caller
                cache[name] = err
        result = cache[name]
        if isinstance(result, Exception):
            raise result
        return result

    return get


@pytest.fixture
def s3_bucket(tested) -> str:
    """A new bucket on the loopback S3 endpoint, for a query whose checkpointRoot is on S3 (spark_state's option)."""
    if tested != "spark_state":
        pytest.skip("spark_state's checkpointRoot")
    import uuid

    s3_server.start()
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(name)
    return name


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """spark_state's wheel, built once per run from a clean copy of the source tree (tests/support/wheel_env.py)."""
    from tests.support import wheel_env

    return wheel_env.build_wheel(tmp_path_factory.mktemp("wheel"))
