"""A test-side client of ``python -m spark_state.worker``: the process and its frames, as the JVM shim sees them.

The worker is started exactly as the shim starts it (secret on stdin, ``READY <pid>`` on stdout) from
this checkout (cwd and PYTHONPATH), so tests exercise the real process, socket and protocol. A worker
that dies (SIGKILL, a fault point's ``exit``) surfaces as ``WorkerGone`` on the request in flight.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from spark_state.worker.protocol import read_frame, write_frame
from tests.support.paths import ROOT, pythonpath_with_root

SECRET = "s3cr3t-for-this-test"


class WorkerGone(Exception):
    """The worker closed the connection without answering (it died)."""


class Connection:
    """One authenticated connection: request/response frames, or send now and receive later."""

    def __init__(self, sock: socket.socket, hello: dict):
        self.sock = sock
        self.stream = sock.makefile("rwb")
        self.hello = hello

    def send(self, header: dict, body: bytes = b"") -> None:
        try:
            write_frame(self.stream, header, body)
        except (BrokenPipeError, ConnectionResetError) as err:
            raise WorkerGone(f"{header.get('op')}: {err}") from None

    def receive(self) -> tuple[dict, bytes]:
        try:
            frame = read_frame(self.stream)
        except (EOFError, ConnectionResetError) as err:
            raise WorkerGone(str(err)) from None
        if frame is None:
            raise WorkerGone("connection closed before the reply")
        return frame

    def request(self, header: dict, body: bytes = b"") -> tuple[dict, bytes]:
        self.send(header, body)
        return self.receive()

    def close(self) -> None:
        for closing in (self.stream.close, self.sock.close):
            try:
                closing()
            except OSError:
                pass


class Worker:
    """A worker process started the way the shim starts it.

    ``env`` adds to the inherited environment (e.g. ``SPARK_STATE_FAULT_DIR``). ``restart()`` kills
    the process and starts a new one at once without waiting for it; the next ``connect()`` or
    ``ready()`` waits for its READY line, so a restart overlaps with the test's other work. With
    ``spare=True`` the next process is started ahead (its own socket directory) and sent
    ``warmup`` (a request that imports what requests need), so a restart costs a test next to
    nothing: Python, pyarrow and spark_state's storage modules take ~1 s to import.
    """

    def __init__(self, workdir: Path | None = None, *, env: dict[str, str] | None = None, wait: bool = True,
                 spare: bool = False, warmup: dict | None = None):
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ssw-"))
        self._own_workdir = workdir is None
        self.env = dict(env or {})
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.dir: Path | None = None
        self.log_path = self.workdir / "worker.log"
        self._log = open(self.log_path, "ab")
        self._dirs = itertools.count()
        self._spare_wanted = spare
        self._warmup = warmup
        self._spare: tuple[subprocess.Popen, Path, threading.Thread, list] | None = None
        self._spawn()
        if wait:
            self.ready()

    def _launch(self) -> tuple[subprocess.Popen, Path]:
        n = next(self._dirs)
        directory = self.workdir / ("sock" if n == 0 else f"sock{n}")   # short: a socket path has ~107 bytes
        directory.mkdir(mode=0o700, exist_ok=True)
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = pythonpath_with_root(env)
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_state.worker", "--socket-dir", str(directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=ROOT, env=env,
        )
        proc.stdin.write(SECRET.encode() + b"\n")
        proc.stdin.flush()
        return proc, directory

    def _spawn(self) -> None:
        self.starts += 1
        self._log.write(f"---- start {self.starts}\n".encode())
        self._log.flush()
        self.pid = None
        if self._spare is not None:
            (self.proc, self.dir, thread, started), self._spare = self._spare, None
            thread.join()
            if started:
                self.pid = started[0]
        else:
            self.proc, self.dir = self._launch()
        if self._spare_wanted:
            proc, directory = self._launch()
            started: list = []
            thread = threading.Thread(target=self._prepare, args=(proc, directory, started), daemon=True)
            thread.start()
            self._spare = (proc, directory, thread, started)

    def _prepare(self, proc: subprocess.Popen, directory: Path, started: list) -> None:
        """Waits for a spare's READY line and warms it up; leaves `started` empty if it failed (ready() reports)."""
        line = proc.stdout.readline().decode()
        if not line.startswith("READY "):
            return
        started.append(int(line.split()[1]))
        if self._warmup is not None:
            try:
                conn = self._connect(directory, SECRET)
                conn.request(self._warmup)
                conn.close()
            except (OSError, WorkerGone):
                pass

    def ready(self) -> int:
        """Waits for the READY line of the current process; its pid."""
        if self.pid is None:
            line = self.proc.stdout.readline().decode()
            if not line.startswith("READY "):
                raise RuntimeError(f"worker did not start ({line!r}); log tail:\n{self.log_tail()}")
            self.pid = int(line.split()[1])
        return self.pid

    def connect(self, secret: str = SECRET) -> Connection:
        self.ready()
        return self._connect(self.dir, secret)

    @staticmethod
    def _connect(directory: Path, secret: str) -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(directory / "worker.sock"))
        conn = Connection(sock, {})
        conn.send({"op": "hello", "secret": secret, "protocol": 1})
        conn.hello = conn.receive()[0]
        return conn

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, like an executor's worker killed by the OS; waits until it is gone."""
        _kill(self.proc)

    def restart(self) -> None:
        self.kill()
        self._spawn()

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        if self.proc is not None:
            self.kill()
        if self._spare is not None:
            _kill(self._spare[0])
            self._spare[2].join()
        self._log.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass
