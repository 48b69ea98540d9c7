"""A real S3-compatible endpoint on loopback (moto's server), for tests that claim S3.

``start()`` binds 127.0.0.1 on a free port and points botocore/s3fs at it
through the standard AWS environment variables, so child processes (the
Spark JVM and the spark_state worker it starts) reach the same endpoint.
"""

from __future__ import annotations

import os
import socket

_server = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def endpoint_env() -> dict[str, str]:
    """Environment for an endpoint on a port chosen now; call before any child process starts."""
    port = int(os.environ.get("SPARK_STATE_TEST_S3_PORT") or _free_port())
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
