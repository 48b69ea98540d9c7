"""Entry point of the worker: ``python -m spark_state.worker --socket-dir DIR``, or ``main`` as the JVM shim
runs it (``WorkerProcess.BOOTSTRAP``: the same, without the working directory on ``sys.path``).

The secret arrives as the first line on stdin; the worker then watches stdin
and exits at EOF, which is how it follows the JVM that started it however
that JVM ends (a killed driver included). No orphan survives its JVM.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
import time

from spark_state.worker import warmup
from spark_state.worker.server import Dispatcher, WorkerServer


def _exit_when_parent_gone(sock_path: str) -> None:
    parent = os.getppid()

    def on_stdin_eof():
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        _cleanup_and_exit(sock_path, "stdin closed: the JVM that started this worker has ended")

    def on_reparent():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                _cleanup_and_exit(sock_path, "parent process is gone")

    threading.Thread(target=on_stdin_eof, name="stdin-watch", daemon=True).start()
    threading.Thread(target=on_reparent, name="parent-watch", daemon=True).start()


def _cleanup_and_exit(sock_path: str, why: str) -> None:
    logging.getLogger("spark_state.worker").info("exiting: %s", why)
    try:
        os.unlink(sock_path)
    except OSError:
        pass
    # row images copied for the JVM: it deletes each once open; what a killed task left goes with the worker
    shutil.rmtree(os.path.join(os.path.dirname(sock_path), "images"), ignore_errors=True)
    os._exit(0)


class _NoPandas:
    """Refuses to import pandas (see ``_without_pandas``)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError("spark_state's worker does not load pandas (it uses none of it)", name=name)
        return None


def _without_pandas() -> None:
    """Keeps pandas out of the worker. pyarrow's ``to_numpy`` imports it whenever it is installed (an
    ``applyInPandasWithState`` user has it), though the worker uses none of it: 45-50 MiB of resident memory
    and 0.3 s of imports in every executor's worker, beside the executor's heap. pyarrow treats the
    ImportError as pandas being absent. Mind it: without pandas, pyarrow 26's ``to_numpy`` of a
    ``month_day_nano_interval`` column (Spark's CalendarIntervalType), or of one nested in a struct or list,
    crashes the process; the worker calls ``to_numpy`` only on integer columns (kg, hash, offsets, dictionary
    indices) and must keep to that."""
    if not any(isinstance(finder, _NoPandas) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


def _memory_pool() -> None:
    """Arrow's buffers from the C allocator, unless the user chose a pool (ARROW_DEFAULT_MEMORY_POOL): the
    worker holds a compaction's buffers briefly and then idles, and mimalloc (pyarrow's default) keeps what
    it freed; peak RSS of compacting 1.25M + 1.25M rows, 301 -> 224 MiB (benchmarks/compaction_memory.py)."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_state.worker")
    parser.add_argument("--socket-dir", required=True, help="private (0700) directory for worker.sock")
    args = parser.parse_args(argv)

    logging.basicConfig(level=os.environ.get("SPARK_STATE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    _without_pandas()
    _memory_pool()
    secret = sys.stdin.readline().strip()
    if not secret:
        print("spark_state worker: expected the secret on the first line of stdin", file=sys.stderr)
        return 2
    sock_path = os.path.join(args.socket_dir, "worker.sock")
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    # Only the socket is private (it is born 0600 inside a 0700 directory); state files keep the
    # process's normal umask so Spark's own readers, running as other users, can read the checkpoint.
    previous = os.umask(0o077)
    try:
        server = WorkerServer(sock_path, Dispatcher(secret, cache_dir=os.path.join(args.socket_dir, "images")))
    finally:
        os.umask(previous)
    os.chmod(sock_path, 0o600)
    _exit_when_parent_gone(sock_path)
    print(f"READY {os.getpid()}", flush=True)
    warmup.start_in_background()
    server.serve_forever(poll_interval=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
