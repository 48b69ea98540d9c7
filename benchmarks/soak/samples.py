"""Samples taken while the soak runs, appended to JSON-lines files as they are taken (so a report can be
rebuilt from them if the run dies): memory of every process, state files on S3, batch progress."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class Sampler:
    """Every ``every`` seconds: RSS of the executor JVMs, spark_state workers, driver JVM, this process and the
    S3 server; objects and bytes on S3; each query's new batches (id, duration, input rows)."""

    def __init__(self, world, queries: dict, out: Path, every: float = 5.0):
        self.world, self.queries, self.every = world, queries, every
        self.samples_path, self.progress_path = out / "samples.jsonl", out / "progress.jsonl"
        self.started = time.time()
        self._seen: set[tuple[str, str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self.error: str | None = None

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.sample()
            except Exception as err:  # noqa: BLE001 - a missed sample is noted, the soak goes on
                self.error = f"{type(err).__name__}: {err}"

    def sample(self) -> dict:
        import os

        from tests.cluster.processes import executor_jvms
        from tests.support.processes import driver_jvm_pid, worker_pids

        spark = self.world.spark
        jvms = executor_jvms(spark)
        workers = {w: rss_mib(w) for jvm in jvms for w in worker_pids(jvm)}
        objects = self.world.objects("state/")
        sample = {
            "t": time.time(), "elapsed_s": round(time.time() - self.started, 1),
            "executors": {str(p): rss_mib(p) for p in jvms},
            "workers": {str(p): r for p, r in workers.items()},
            "driver_jvm": rss_mib(driver_jvm_pid(spark)), "harness": rss_mib(os.getpid()),
            "s3_server": rss_mib(self.world.procs["moto"].pid),
            "s3_objects": len(objects), "s3_mib": round(sum(o["Size"] for o in objects) / 2**20, 2),
            "proxy": self.world.proxy.totals(),
        }
        with open(self.samples_path, "a") as f:
            f.write(json.dumps(sample) + "\n")
        with open(self.progress_path, "a") as f:
            for name, q in self.queries.items():
                for p in q.recent_progress():
                    key = (name, p.get("runId", ""), int(p.get("batchId", -1)))
                    if key in self._seen:
                        continue
                    self._seen.add(key)
                    f.write(json.dumps({"query": name, "batch": key[2], "t": p.get("timestamp"),
                                        "duration_ms": (p.get("durationMs") or {}).get("triggerExecution"),
                                        "rows": p.get("numInputRows", 0), "spills": _spills(p)}) + "\n")
        return sample


def _spills(progress: dict) -> int:
    """The batch's spills into sorted runs, all its stateful operators together (Metrics.java's sparkStateSpills)."""
    return sum(int((op.get("customMetrics") or {}).get("sparkStateSpills", 0) or 0)
               for op in progress.get("stateOperators") or [])
