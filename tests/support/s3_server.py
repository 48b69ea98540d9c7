"""A real S3-compatible endpoint on loopback (moto's server), for tests that claim S3.

``start()`` binds 127.0.0.1 on a free port and points botocore/s3fs at it
through the standard AWS environment variables, so child processes (the
Spark JVM and the spark_state worker it starts) reach the same endpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port, wait_listening

_server = None
_ROOT = Path(__file__).resolve().parents[2]


def endpoint_env() -> dict[str, str]:
    """Environment for an endpoint on a port chosen now; call before any child process starts."""
    port = int(os.environ.get("SPARK_STATE_TEST_S3_PORT") or free_port())
    return {
        "SPARK_STATE_TEST_S3_PORT": str(port),
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def start() -> str:
    """Starts the server once per process (idempotent) and returns its endpoint URL."""
    global _server
    os.environ.update(endpoint_env())
    if _server is None:
        from moto.server import ThreadedMotoServer

        _server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(os.environ["SPARK_STATE_TEST_S3_PORT"]), verbose=False)
        _server.start()
    return os.environ["AWS_ENDPOINT_URL"]


def make_bucket(name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=start()).create_bucket(Bucket=name)


def start_process(ranged: bool = False) -> tuple[str, subprocess.Popen]:
    """A moto server in a process of its own, on a free port: (endpoint URL, process).

    For tests whose several worker processes load the endpoint hard: a server thread inside
    the test process would share its interpreter lock with the test. The caller passes the URL
    to its processes and stops the server. ``ranged``: ranged GETs read only their range, as S3's
    do (``tests/support/moto_ranges.py``; moto's own read the whole object), for benchmarks of range reads.
    """
    module = "tests.support.moto_ranges" if ranged else "moto.server"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", module, "-H", "127.0.0.1", "-p", str(port)], cwd=_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_listening(port, proc, 60):
        proc.kill()
        raise RuntimeError(f"moto server did not start on port {port}")
    return f"http://127.0.0.1:{port}", proc
