"""One Spark application on two executor JVMs for the cluster tests: ``local-cluster[2,1,1024]``.

Run apart from the main suite (its session is ``local[2]`` and a Python process
holds one SparkContext): ``python -m pytest -q tests/cluster``.

The session is configured to make state move and collide:

- ``spark.locality.wait=0``: a task runs on whichever executor is free;
- ``spark.excludeOnFailure.*``: a task that failed on an executor is retried on
  the *other* one, so a failure after the state commit moves the store;
- ``spark.speculation``: a task stuck for 3 s gets a copy on the other executor;
- state store maintenance (retention, compaction) every second, with
  ``snapshotInterval=2``, ``minBatchesToRetain=2``, ``fileGracePeriod=0`` on every
  query (``harness.CLUSTER_OPTIONS``);
- ``SPARK_STATE_FAULT_DIR`` in the executors' environment, so a test can arm the
  worker's fault injection points (``faults.Faults``).

Executor logs land in a private ``SPARK_HOME`` under the session's tmp dir, never
in the installed pyspark package.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

LOG4J = Path(__file__).with_name("log4j2.properties")

#: Seconds a task may run before Spark starts a speculative copy on another executor.
SPECULATION_AFTER_S = 3


def private_spark_home(where: Path) -> Path:
    """A SPARK_HOME that mirrors the pip pyspark package but has its own ``work/`` directory.

    The standalone worker of local-cluster writes executor logs to
    ``$SPARK_HOME/work``; this keeps them out of the shared virtualenv.
    """
    import pyspark

    package = Path(pyspark.__file__).parent
    home = where / "spark-home"
    home.mkdir(parents=True, exist_ok=True)
    for entry in package.iterdir():
        link = home / entry.name
        if entry.name != "work" and not link.exists():
            link.symlink_to(entry)
    return home


def cluster_builder(spark_home: Path, fault_dir: Path, app_name: str = "spark_state cluster tests"):
    from pyspark.sql import SparkSession

    os.environ["SPARK_HOME"] = str(spark_home)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    pythonpath = os.pathsep.join(dict.fromkeys(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    os.environ["PYTHONPATH"] = pythonpath
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.executorEnv.PYTHONPATH": pythonpath,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executorEnv.SPARK_STATE_FAULT_DIR": str(fault_dir),
        "spark.pyspark.python": sys.executable,
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
        # tasks go wherever a core is free
        "spark.locality.wait": "0",
        "spark.task.maxFailures": "4",
        # a failed task attempt is retried on another executor (the state moves with it)
        "spark.excludeOnFailure.enabled": "true",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor": "1",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "3",
        "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor": "100",
        "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode": "100",
        "spark.excludeOnFailure.application.maxFailedTasksPerExecutor": "100",
        "spark.excludeOnFailure.application.maxFailedExecutorsPerNode": "100",
        "spark.scheduler.excludeOnFailure.unschedulableTaskSetTimeout": "5s",
        # a task stuck (in a commit, in a UDF) gets a speculative copy on the other executor
        "spark.speculation": "true",
        "spark.speculation.interval": "200ms",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.multiplier": "2",
        "spark.speculation.minTaskRuntime": f"{SPECULATION_AFTER_S}s",
        "spark.speculation.efficiency.enabled": "false",
    }
    builder = SparkSession.builder.master("local-cluster[2,1,1024]").appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder


@pytest.fixture(scope="session")
def cluster_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="session")
def faults(cluster_dir):
    """The fault injection points of every worker of the cluster application (faults.Faults)."""
    from tests.cluster.faults import Faults

    return Faults(cluster_dir / "faults")


@pytest.fixture(scope="session")
def cluster(cluster_dir, faults):
    """The local-cluster SparkSession with spark_state, both executors up."""
    import spark_state
    from tests.cluster.processes import wait_for_executors

    started = time.monotonic()
    builder = cluster_builder(private_spark_home(cluster_dir), faults.root)
    session = spark_state.configure(builder, storage="filesystem").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    wait_for_executors(session, 2, timeout=180)
    print(f"\ncluster up in {time.monotonic() - started:.1f}s", file=sys.stderr)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def healthy_cluster(request, faults):
    """Each test starts on two live executors and no armed fault (tests check their faults fired)."""
    if "cluster" not in request.fixturenames:
        yield
        return
    from tests.cluster.processes import wait_for_executors

    spark = request.getfixturevalue("cluster")
    faults.clear()
    wait_for_executors(spark, 2, timeout=180)   # a test may have killed one: the master starts another
    yield
    faults.clear()
