"""The cluster recipe of docs/getting-started.md, end to end: a Spark standalone cluster on 127.0.0.1 (a master and
two workers started with ``spark-class`` from the pip pyspark), the application submitted with
``spark-submit``, spark_state and its Python shipped to the executors as a venv-pack archive,
state on a loopback S3 endpoint (moto), and a restart from the checkpoint. No javac on PATH.

Slow (a full venv install, a ~0.5 GB archive, five JVMs): opt-in with --run-slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import fsspec
import pytest

from tests.support import wheel_env
from tests.support.ports import free_port

pytestmark = pytest.mark.slow


class Cluster:
    """A standalone master and workers, each a process this test started (and stops, by pid)."""

    def __init__(self, bin_dir: Path, work: Path, env: dict):
        self.bin, self.work, self.env = bin_dir, work, env
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args) -> Path:
        log = self.work / f"{name}.log"
        with open(log, "w") as out:
            self.procs.append(subprocess.Popen([str(self.bin / "spark-class"), *map(str, args)], stdout=out,
                                               stderr=subprocess.STDOUT, env=self.env, cwd=self.work,
                                               stdin=subprocess.DEVNULL))
        return log

    def start(self, workers: int = 2) -> None:
        master_log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", self.port, "--webui-port", free_port())
        for i in range(workers):
            work_dir = self.work / f"worker{i}"
            work_dir.mkdir()
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--cores", "1", "--memory", "1g", "--webui-port", free_port(), "--work-dir", work_dir)
        deadline = time.monotonic() + 180  # readiness wait, not an assertion on speed
        while master_log.read_text().count("Registering worker") < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise wheel_env.AppFailed(f"the cluster did not come up; master log:\n{master_log.read_text()[-3000:]}")
            time.sleep(1)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_standalone_cluster_with_packed_venv_and_state_on_s3_survives_restart(wheel, tmp_path, s3_bucket):
    # The application's environment, packed for the executors as a user would.
    python = wheel_env.make_venv(tmp_path / "venv")
    wheel_env.pip_install(python, f"{wheel}[s3]", "venv-pack", log=tmp_path / "pip.log")
    archive = tmp_path / "environment.tar.gz"
    wheel_env.run([tmp_path / "venv" / "bin" / "venv-pack", "-p", tmp_path / "venv", "-o", archive],
                  log=tmp_path / "venv-pack.log")
    jar = subprocess.run([python, "-m", "spark_state.spark.shim", "path"], capture_output=True, text=True,
                         check=True).stdout.strip()

    env = wheel_env.jre_env(tmp_path)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The venv activated, as in docs/getting-started.md: spark-class finds pyspark through `python3` on PATH.
    env["PATH"] = f"{tmp_path / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(tmp_path / "venv")
    cluster = Cluster(tmp_path / "venv" / "bin", tmp_path, env)
    aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    submit = [tmp_path / "venv" / "bin" / "spark-submit", "--master", cluster.url,
              "--archives", f"{archive}#environment",
              "--jars", jar,
              "--conf", "spark.pyspark.python=./environment/bin/python",
              "--conf", f"spark.pyspark.driver.python={python}",
              "--conf", "spark.sql.streaming.stateStore.providerClass=io.sparkstate.shim.SparkStateProvider",
              "--conf", "spark.sql.streaming.stateStore.sparkState.python=./environment/bin/python",
              "--conf", f"spark.sql.streaming.stateStore.sparkState.checkpointRoot=s3://{s3_bucket}/state",
              "--conf", "spark.sql.streaming.streamingQueryListeners=io.sparkstate.shim.MaintenanceWarnings",
              "--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=2"]
    for key, value in aws.items():
        submit += ["--conf", f"spark.executorEnv.{key}={value}"]
    try:
        cluster.start()
        app = tmp_path / "app"
        first = wheel_env.run_app(python, app, 1, dict(env, **aws), launcher=submit, timeout=600)
        second = wheel_env.run_app(python, app, 2, dict(env, **aws), launcher=submit, timeout=600)
    finally:
        cluster.stop()

    assert first["totals"] == {"a": 4, "b": 2}
    assert second["totals"] == {"a": 14, "c": 5}  # restored from S3 by a new application
    assert second["javac"] is None
    assert all(r["listeners"] == ["io.sparkstate.shim.MaintenanceWarnings"] for r in (first, second))
    assert all(not problems for r in (first, second) for problems in r["contract"].values())
    # The UDFs ran in the shipped environment, unpacked in the executors' work directories.
    for result in (first, second):
        assert result["pythons"] and all("/worker" in p and p.endswith("/environment/bin/python")
                                         for p in result["pythons"]), result["pythons"]
    # Both workers ran executors, and the state lives on S3, not in the checkpoint directory.
    assert all(list((tmp_path / f"worker{i}").glob("app-*")) for i in range(2))
    fs = fsspec.filesystem("s3")
    assert [p for p in fs.find(f"{s3_bucket}/state") if p.endswith("/_metadata")]
    assert not list((app / "checkpoint" / "state").rglob("*.arrow"))
    # Passed: drop the ~5 GB of venv, archive and unpacked copies (a failure keeps them for a look).
    archive.unlink()
    for big in [tmp_path / "venv"] + [tmp_path / f"worker{i}" for i in range(2)]:
        shutil.rmtree(big, ignore_errors=True)
