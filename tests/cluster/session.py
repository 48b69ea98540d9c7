"""The cluster application's configuration: which cluster, and the session settings that make state move
and collide (tests/cluster/conftest.py describes them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support import quick_jvm

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


def session_conf(fault_dir: Path, pythonpath: str, s3_port: int | None = None) -> dict[str, str]:
    """The cluster's conf; ``s3_port``: where the executors' S3 clients go (``AWS_ENDPOINT_URL``), the proxy in
    front of the moto server a test that needs S3 starts (conftest ``cluster_s3``); None: no S3."""
    java_opts = " ".join([f"-Dlog4j2.configurationFile=file:{LOG4J}", *quick_jvm.flags()])
    # every batch's changes stream to the worker in chunks of two rows while the task runs (docs/protocol.md,
    # "Streamed commits"), so each fault below also meets a commit that was streamed
    streamed = "-Dio.sparkstate.batchRows=2 -Dio.sparkstate.streamChunkBytes=1"
    s3 = {} if s3_port is None else {
        "spark.executorEnv.AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
        "spark.executorEnv.AWS_ACCESS_KEY_ID": "testing",
        "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "testing",
        "spark.executorEnv.AWS_DEFAULT_REGION": "us-east-1",
    }
    return {
        **s3,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": f"{java_opts} {streamed}",
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
