"""Spark Connect: a local Connect server started with spark_state (docs/getting-started.md's command line), and
an applyInPandasWithState query from a Connect client that knows nothing of spark_state, restarted
against a new server from its checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import spark_state
from spark_state.spark.config import MAINTENANCE_LISTENER
from tests.support import wheel_env
from tests.support.paths import LOG4J, TESTS
from tests.support.ports import free_port, wait_listening

pytest.importorskip("grpc", reason="the Spark Connect client needs grpcio (pip install '.[test]')")
CLIENT = TESTS / "support" / "connect_client.py"


class ConnectServer:
    """``start-connect-server.sh --wait`` with spark_state's jar and conf, in its own process group."""

    def __init__(self, work: Path, name: str):
        import pyspark

        self.port = free_port()
        self.log = work / f"{name}.log"
        sbin = Path(pyspark.__file__).parent / "sbin"
        cmd = [str(sbin / "start-connect-server.sh"), "--wait", "--master", "local[2]",
               "--jars", str(spark_state.shim_jar()),
               "--conf", f"spark.sql.streaming.stateStore.providerClass={spark_state.PROVIDER_CLASS}",
               "--conf", f"spark.sql.streaming.stateStore.sparkState.python={sys.executable}",
               "--conf", f"spark.sql.streaming.streamingQueryListeners={MAINTENANCE_LISTENER}",
               "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", f"spark.connect.grpc.binding.port={self.port}",
               "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", "spark.sql.shuffle.partitions=2",
               "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{LOG4J}"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
        env.update(SPARK_LOG_DIR=str(work / "spark-logs"), SPARK_PID_DIR=str(work), SPARK_IDENT_STRING=name,
                   PYSPARK_PYTHON=sys.executable)  # the Python of Connect clients' UDFs on the server
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=work, start_new_session=True)
        if not wait_listening(self.port, self.proc, 180):   # readiness wait, not an assertion on speed
            self.stop()
            raise wheel_env.AppFailed(f"the Connect server did not start; log {self.log}:\n"
                                      + self.log.read_text(errors="replace")[-3000:])
        self.url = f"sc://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stops the server's process group (the script and the JVM it runs), which this test started."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def run_client(url: str, workdir: Path, phase: int) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    out = wheel_env.run([sys.executable, CLIENT, url, workdir, phase], log=workdir / f"client{phase}.log",
                        env=env, cwd=workdir, timeout=300)
    line = next(line for line in reversed(out.splitlines()) if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_apply_in_pandas_with_state_from_a_connect_client_survives_a_server_restart(tmp_path, tested):
    if tested != "spark_state":
        pytest.skip("a server started with spark_state")
    app = tmp_path / "app"
    app.mkdir()
    results = []
    for phase in (1, 2):  # a new server each time: the state comes back from the checkpoint
        server = ConnectServer(tmp_path, f"server{phase}")
        try:
            results.append(run_client(server.url, app, phase))
        finally:
            server.stop()

    assert all(r["connect"] for r in results)
    assert all(r["provider"] == spark_state.PROVIDER_CLASS for r in results)
    assert results[0]["totals"] == {"a": 4, "b": 2}
    assert results[1]["totals"] == {"a": 14, "b": 2, "c": 5}  # a continues from the first server's state
    assert list((app / "checkpoint" / "state").rglob("chk-*/_metadata")), "no spark_state manifests"
