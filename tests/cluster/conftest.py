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
  worker's fault injection points (``faults.Faults``);
- ``AWS_ENDPOINT_URL`` in the executors' environment: the loopback S3 server a test
  that needs it starts (``cluster_s3``).

Executor logs go under the session's tmp dir, never into the installed pyspark.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.session import KIND, LOG4J, private_spark_home, session_conf
from tests.support.paths import pythonpath_with_root


@pytest.fixture(scope="session")
def cluster_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="session")
def faults(cluster_dir):
    """The fault injection points of every worker of the cluster application (faults.Faults)."""
    from tests.cluster.faults import Faults

    return Faults(cluster_dir / "faults")


@pytest.fixture(scope="session")
def s3_port() -> int:
    """The port the executors reach S3 on, fixed before they start (their ``AWS_ENDPOINT_URL``)."""
    from tests.support.ports import free_port

    return free_port()


@pytest.fixture(scope="session")
def cluster_s3(s3_port, cluster_dir):
    """S3 for the executors, started by the first test that needs it: a moto server in its own process behind
    the fault proxy (no faults) on ``s3_port``, whose counts say how the executors read row images."""
    from tests.support import s3_server
    from tests.support.s3_proxy import S3Proxy

    endpoint, moto = s3_server.start_process()
    proxy = None
    try:
        proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), cluster_dir / "s3-proxy", port=s3_port)
        yield endpoint, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        moto.terminate()
        moto.wait(10)


@pytest.fixture(scope="session")
def cluster(cluster_dir, faults, s3_port):
    """The SparkSession on two executors with spark_state, both executors up."""
    from pyspark.sql import SparkSession

    import spark_state
    from tests.cluster.processes import set_executor_parents, wait_for_executors
    from tests.cluster.standalone import MASTER_HOST, StandaloneCluster

    started = time.monotonic()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    pythonpath = pythonpath_with_root()
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
    for key, value in session_conf(faults.root, pythonpath, s3_port).items():
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
