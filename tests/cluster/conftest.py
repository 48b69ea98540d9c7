"""One Spark application on two executor JVMs for the cluster tests.

Run apart from the main suite (its session is ``local[2]`` and a Python process
holds one SparkContext): ``python -m pytest -q tests/cluster``.

The cluster (``SPARK_STATE_CLUSTER``):

- ``standalone`` (default): a standalone master and two one-core workers on
  127.0.0.1 and 127.0.0.2 (tests/cluster/standalone.py), one executor each.
  Two hosts, so Spark's speculative execution can run;
- ``local-cluster``: ``local-cluster[2,1,1024]``, two executor JVMs on one host.
  Spark never speculates on a host that already runs the task, so the
  speculation tests are skipped there.

The session is configured to make state move and collide:

- ``spark.locality.wait=0``: a task runs on whichever executor is free;
- ``spark.excludeOnFailure.*``: a task that failed on an executor is retried on
  the *other* one, so a failure after the state commit moves the store;
- ``spark.speculation``: a task stuck for 3 s gets a copy on the other executor;
- state store maintenance (retention, compaction) every second, with
  ``snapshotInterval=2``, ``minBatchesToRetain=2``, ``fileGracePeriod=0`` on every
  query (``running_totals.CLUSTER_OPTIONS``);
- ``SPARK_STATE_FAULT_DIR`` in the executors' environment, so a test can arm the
  worker's fault injection points (``faults.Faults``).

Executor logs go under the session's tmp dir, never into the installed pyspark.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

LOG4J = Path(__file__).with_name("log4j2.properties")
KIND = os.environ.get("SPARK_STATE_CLUSTER", "standalone")
if KIND not in ("standalone", "local-cluster"):
    raise ValueError(f"SPARK_STATE_CLUSTER={KIND!r}: use standalone or local-cluster")

#: Seconds a task may run before Spark starts a speculative copy on another executor.
SPECULATION_AFTER_S = 3


def private_spark_home(where: Path) -> Path:
    """A SPARK_HOME that mirrors the pip pyspark package but has its own ``work/`` directory.

    local-cluster's workers write executor logs to ``$SPARK_HOME/work``; this
    keeps them out of the shared virtualenv.
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


def session_conf(fault_dir: Path, pythonpath: str) -> dict[str, str]:
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
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
    """The SparkSession on two executors with spark_state, both executors up."""
    from pyspark.sql import SparkSession

    import spark_state
    from tests.cluster.processes import set_executor_parents, wait_for_executors
    from tests.cluster.standalone import MASTER_HOST, StandaloneCluster

    started = time.monotonic()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    pythonpath = os.pathsep.join(dict.fromkeys(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    os.environ["PYTHONPATH"] = pythonpath
    standalone = None
    if KIND == "standalone":
        standalone = StandaloneCluster(cluster_dir / "standalone", LOG4J).start(dict(os.environ))
        master = standalone.url
        set_executor_parents(standalone.executor_parents())
    else:
        os.environ["SPARK_HOME"] = str(private_spark_home(cluster_dir))
        master = "local-cluster[2,1,1024]"
    builder = SparkSession.builder.master(master).appName("spark_state cluster tests")
    for key, value in session_conf(faults.root, pythonpath).items():
        builder = builder.config(key, value)
    if standalone is not None:
        builder = builder.config("spark.driver.host", MASTER_HOST)
    try:
        session = spark_state.configure(builder, storage="filesystem").getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        wait_for_executors(session, 2, timeout=180)
    except BaseException:
        if standalone is not None:
            print(standalone.logs(), file=sys.stderr)
            standalone.stop()
        raise
    print(f"\n{KIND} cluster up in {time.monotonic() - started:.1f}s", file=sys.stderr)
    yield session
    session.stop()
    if standalone is not None:
        standalone.stop()


@pytest.fixture
def speculation():
    """Skips a test that needs speculative execution where Spark cannot do it (one host)."""
    if KIND != "standalone":
        pytest.skip("local-cluster executors share one host: Spark never speculates there")


@pytest.fixture(autouse=True)
def healthy_cluster(request, faults):
    """Each test starts on two live executors and no armed fault (tests check their faults fired)."""
    if "cluster" not in request.fixturenames:
        yield
        return
    from tests.cluster.processes import wait_for_executors

    spark = request.getfixturevalue("cluster")
    faults.clear()
    wait_for_executors(spark, 2, timeout=180)   # a test may have killed one: its worker starts another
    yield
    faults.clear()
