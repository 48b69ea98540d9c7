"""The soak's fault proxy (``benchmarks/soak/proxy.py``) in front of a loopback S3 server, as tests and
benchmarks drive it: a per-request latency (an object store's first-byte latency), and counts of what went
through it (requests, reply bytes, and row-image GETs by range and whole), without faults."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port, wait_listening

ROOT = Path(__file__).resolve().parents[2]


class S3Proxy:
    """A proxy process on ``port`` (a free one when None) forwarding to ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int, work: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        work.mkdir(parents=True, exist_ok=True)
        self.control = work / "proxy-control.json"
        self.log = work / "proxy-faults.jsonl"
        self._write_control(0)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.soak.proxy", "--port", str(self.port), "--upstream-port",
             str(upstream_port), "--control", str(self.control), "--log", str(self.log)], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_listening(self.port, self.proc, 30):
            self.proc.kill()
            raise RuntimeError(f"the S3 proxy did not start on port {self.port}")

    def _write_control(self, ms: float) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rate": 0.0, "latency_s": ms / 1000}))
        tmp.replace(self.control)

    def set_latency(self, ms: float) -> None:
        """Every request waits ``ms`` before it is forwarded (from the proxy's next re-read of its control
        file, within a second)."""
        self._write_control(ms)
        time.sleep(1.2)

    def stats(self) -> dict:
        """``requests`` and reply ``bytes`` forwarded so far, and ``imageGets``: GETs of row images (``*.img``)
        ``{"range": n, "whole": n}``, by whether they named a byte range."""
        with urllib.request.urlopen(f"{self.url}/__proxy_stats", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
