"""Loopback ports of the servers tests and benchmarks start: a free one, and waiting until a process listens."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's pick; the caller's server binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_listening(port: int, proc: subprocess.Popen, timeout: float, host: str = "127.0.0.1") -> bool:
    """True once something listens on `port`; False when `proc` exited first or `timeout` seconds passed
    (the caller says which server failed, with its log)."""
    deadline = time.monotonic() + timeout
    while not listening(port, host):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
