"""Shared fixtures: one SparkSession for the whole run, the provider under test, slow tests.

Options:
  --run-slow                     also run tests marked ``slow``
  --tested-provider=hdfs         run the end-to-end tests with Spark's HDFS provider on
                                 both sides (validates the harness without the shim);
                                 default ``spark_state`` (env SPARK_STATE_TESTED)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG4J = ROOT / "conf" / "log4j2.properties"

# The loopback S3 endpoint's address must be in the environment before the
# Spark JVM starts: the JVM passes it on to the spark_state worker it starts.
from tests import s3_server  # noqa: E402

os.environ.update(s3_server.endpoint_env())


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")
    parser.addoption("--tested-provider", choices=("spark_state", "hdfs"),
                     default=os.environ.get("SPARK_STATE_TESTED", "spark_state"),
                     help="state store provider the end-to-end tests check against the HDFS reference")


def pytest_ignore_collect(collection_path, config):
    """tests/cluster runs in a pytest process of its own (``pytest tests/cluster``): it needs its own
    SparkSession (local-cluster), and a Python process holds one SparkContext."""
    cluster = Path(__file__).parent / "cluster"
    if collection_path == cluster:
        asked = [Path(str(a).split("::")[0]).resolve() for a in config.args]
        return not any(a == cluster or cluster in a.parents for a in asked)
    return None


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tested(pytestconfig) -> str:
    """The provider under test: "spark_state" (default) or "hdfs" (harness check)."""
    return pytestconfig.getoption("--tested-provider")


def spark_builder(app_name: str = "spark_state tests"):
    """The builder the tests (and their child processes) use: small, quiet, deterministic."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers import the UDFs from the test modules by name.
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return (
        SparkSession.builder.master("local[2]").appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "2s")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J}")
        .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J}")
    )


@pytest.fixture(scope="session")
def spark(tested):
    """One SparkSession (local[2], 2 shuffle partitions) for every end-to-end test."""
    builder = spark_builder()
    if tested == "spark_state":
        import spark_state

        builder = spark_state.configure(builder, storage="filesystem")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def make_twin(spark, tested, tmp_path):
    """make_twin(build, mode=..., options=..., conf=...) -> streaming.Twin in this test's tmp dir."""
    from tests.streaming import Twin

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
    from tests.scenarios import SCENARIOS, run_scenario

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


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """spark_state's wheel, built once per run from a clean copy of the source tree (tests/wheel_env.py)."""
    from tests import wheel_env

    return wheel_env.build_wheel(tmp_path_factory.mktemp("wheel"))
