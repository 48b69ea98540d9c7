"""The soak's world: the S3 server and the fault proxy in front of it, the two-executor standalone
cluster (tests/cluster: a master and two one-core workers on 127.0.0.1 and 127.0.0.2), and the
SparkSession with spark_state keeping every query's state on S3 through the proxy.

S3 retries: spark_state reaches S3 through fsspec's s3fs, configured from the environment
(``FSSPEC_S3``: botocore's ``standard`` retry mode, ``connect_timeout``/``read_timeout``), which
the executors and their spark_state workers inherit; the proxy stalls requests past that read timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cluster.faults import Faults
from tests.cluster.processes import set_executor_parents, wait_for_executors
from tests.cluster.session import LOG4J, session_conf
from tests.cluster.standalone import MASTER_HOST, StandaloneCluster, die_with_parent
from tests.support.ports import free_port, wait_listening
from tests.support.paths import pythonpath_with_root

BUCKET = "soak"
STATE_ROOT = f"s3://{BUCKET}/state"
#: The client's read timeout (s); the proxy's stalls last longer.
READ_TIMEOUT_S = 5
S3_CLIENT = {"config_kwargs": {"connect_timeout": 5, "read_timeout": READ_TIMEOUT_S,
                               "retries": {"mode": "standard", "max_attempts": 10}}}


class Proxy:
    """Controls the fault proxy process: its fault rate, and the faults it logged."""

    def __init__(self, workdir: Path):
        self.control = workdir / "proxy-control.json"
        self.log = workdir / "proxy-faults.jsonl"
        self.stats = Path(f"{self.log}.stats.json")

    def set(self, rate: float, stall_s: float = READ_TIMEOUT_S + 3) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rate": rate, "stall_s": stall_s}))
        tmp.replace(self.control)

    def totals(self) -> dict:
        try:
            return json.loads(self.stats.read_text())
        except (OSError, ValueError):
            return {"requests": 0, "faults": {}}


class World:
    """Everything the soak runs on; ``stop()`` ends it (its processes also die with this one)."""

    def __init__(self, workdir: Path, *, seed: int, options: dict):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.seed, self.options = seed, options
        self.procs: dict[str, subprocess.Popen] = {}
        self.proxy = Proxy(self.workdir)
        self.faults = Faults(self.workdir / "fault-points")
        self.standalone: StandaloneCluster | None = None
        self.spark = None

    # ------------------------------------------------------------------ S3 and the proxy

    def _spawn(self, name: str, args: list[str], port: int) -> None:
        log = open(self.workdir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        if not wait_listening(port, self.procs[name], 60):
            how = "exited" if self.procs[name].poll() is not None else f"not listening on 127.0.0.1:{port} within 60s"
            raise RuntimeError(f"{name} {how}: {(self.workdir / f'{name}.log').read_text()[-2000:]}")

    def start_storage(self) -> None:
        moto_port, proxy_port = free_port(), free_port()
        self.moto_url = f"http://127.0.0.1:{moto_port}"
        self._spawn("moto", ["-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)], moto_port)
        self.proxy.set(0.0)
        self._spawn("proxy", ["-m", "benchmarks.soak.proxy", "--port", str(proxy_port), "--upstream-port",
                              str(moto_port), "--control", str(self.proxy.control), "--log", str(self.proxy.log),
                              "--seed", str(self.seed)], proxy_port)
        self.env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy_port}", "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                    "FSSPEC_S3": json.dumps(S3_CLIENT)}
        os.environ.update(self.env)
        self.s3().create_bucket(Bucket=BUCKET)

    def s3(self):
        """A boto3 client straight to the S3 server (no proxy): the harness's own look at storage."""
        import boto3

        return boto3.client("s3", endpoint_url=self.moto_url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def objects(self, prefix: str = "") -> list[dict]:
        out, token = [], None
        client = self.s3()
        while True:
            kw = {"Bucket": BUCKET, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
            page = client.list_objects_v2(**kw)
            out.extend(page.get("Contents", []))
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    # ------------------------------------------------------------------ Spark

    def start_spark(self):
        from pyspark.sql import SparkSession

        import spark_state

        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        pythonpath = pythonpath_with_root()
        os.environ["PYTHONPATH"] = pythonpath
        self.standalone = StandaloneCluster(self.workdir / "standalone", LOG4J).start(dict(os.environ))
        set_executor_parents(self.standalone.executor_parents())
        conf = session_conf(self.faults.root, pythonpath)
        conf = {**conf,
                # Spark's check whether a stopped query's error came from its own interrupt runs a backtracking
                # regex over the whole message; a foreachBatch stopped inside a Python call has a long one, and
                # the stream thread dies of a StackOverflowError on the default 1 MiB stack.
                "spark.driver.extraJavaOptions": conf["spark.driver.extraJavaOptions"] + " -Xss64m",
                **{f"spark.executorEnv.{k}": v for k, v in self.env.items()},
                "spark.driver.host": MASTER_HOST,
                "spark.sql.streaming.minBatchesToRetain": "10",
                "spark.sql.streaming.stateStore.maintenanceInterval": "5s"}
        builder = SparkSession.builder.master(self.standalone.url).appName("spark_state soak")
        for key, value in conf.items():
            builder = builder.config(key, value)
        try:
            self.spark = spark_state.configure(builder, **self.options).getOrCreate()
            self.spark.sparkContext.setLogLevel("ERROR")
            wait_for_executors(self.spark, 2, timeout=180)
        except BaseException:
            print(self.standalone.logs(), file=sys.stderr)
            self.stop()
            raise
        return self.spark

    def stop(self) -> None:
        if self.spark is not None:
            for q in self.spark.streams.active:
                q.stop()
            self.spark.stop()
            self.spark = None
        if self.standalone is not None:
            self.standalone.stop()
            self.standalone = None
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self.procs.clear()
