"""A Spark standalone cluster of two one-core workers on two loopback addresses.

Why not only ``local-cluster[2,1,1024]``: its executors all run on one host,
and Spark never starts a speculative copy of a task on a host where an attempt
of it already runs (``TaskSetManager.hasAttemptOnHost``), so speculation
cannot happen there. Here each worker (and its executor) is its own host,
127.0.0.1 and 127.0.0.2, so speculative copies, task retries and moves all
cross hosts, as on a real cluster. Everything still runs from the pip
``pyspark`` (its ``jars/``), with no download.

Master and workers are children of the test process and die with it
(``PR_SET_PDEATHSIG``); executors are children of their worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

from tests.support import quick_jvm
from tests.support.ports import free_port, wait_listening

HOSTS = ("127.0.0.1", "127.0.0.2")
MASTER_HOST = HOSTS[0]


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL this process when the process that started it ends."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class StandaloneCluster:
    """Master + one worker per host in ``HOSTS``; ``url`` is the master URL for the application."""

    def __init__(self, workdir: Path, log4j: Path, cores: int = 1, memory: str = "1g"):
        import pyspark

        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spark_home = Path(pyspark.__file__).parent
        self.log4j, self.cores, self.memory = log4j, cores, memory
        self.port = free_port(MASTER_HOST)
        self.url = f"spark://{MASTER_HOST}:{self.port}"
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def _start(self, name: str, main: str, args: list[str], env: dict) -> subprocess.Popen:
        java = str(Path(os.environ["JAVA_HOME"], "bin", "java")) if os.environ.get("JAVA_HOME") else "java"
        cmd = [java, "-Xmx256m", *quick_jvm.flags(), f"-Dlog4j2.configurationFile=file:{self.log4j}",
               "-cp", f"{self.spark_home}/conf:{self.spark_home}/jars/*", main, *args]
        log = open(self.workdir / f"{name}.log", "w")
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=die_with_parent)

    def start(self, env: dict, timeout: float = 120) -> "StandaloneCluster":
        """Starts the master, waits until it listens, starts the workers (``env``: theirs and their executors')."""
        env = {**env, "SPARK_HOME": str(self.spark_home), "SPARK_SCALA_VERSION": "2.13"}
        self.master = self._start("master", "org.apache.spark.deploy.master.Master",
                                  ["--host", MASTER_HOST, "--port", str(self.port), "--webui-port", "0"], env)
        if not wait_listening(self.port, self.master, timeout, MASTER_HOST):
            raise AssertionError(f"standalone master {'exited' if self.master.poll() is not None else 'not listening'}"
                                 f" on {self.url} within {timeout}s: "
                                 f"{(self.workdir / 'master.log').read_text()[-3000:]}")
        for i, host in enumerate(HOSTS):
            self.workers.append(self._start(
                f"worker-{host}", "org.apache.spark.deploy.worker.Worker",
                ["--host", host, "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                 "--work-dir", str(self.workdir / f"work-{host}"), self.url], env))
        return self

    def executor_parents(self) -> list[int]:
        return [w.pid for w in self.workers]

    def stop(self) -> None:
        """Workers first (they stop their executors), then the master; SIGKILL what lingers."""
        procs = self.workers + ([self.master] if self.master else [])
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.workdir.glob("*.log")))
