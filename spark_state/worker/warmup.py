"""Work a new worker does once, in the background, right after it is ready.

The worker answers requests as soon as its socket listens; the modules that
commits and loads need (the chain, the data file format, storages, pyarrow's compute and IPC
kernels, zstd) are imported lazily, which would otherwise put ~0.5 s of
imports and first-call set-up inside the first commit or restore of every new
executor. ``warm_up`` pays that while the JVM is still busy elsewhere. It is
best effort: a failure is logged and the first request simply pays the cost.
The storage backend of a remote ``checkpointRoot`` (s3fs and aiobotocore: ~0.4 s
more) is warmed the same way as soon as a ``validate`` request names it
(``warm_storage_in_background``). Set ``SPARK_STATE_WORKER_WARMUP=0`` to skip both.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("spark_state.worker")


def enabled() -> bool:
    return os.environ.get("SPARK_STATE_WORKER_WARMUP", "1").strip().lower() not in ("0", "false", "no")


def warm_up() -> float:
    """Imports what commits and loads use and runs each kernel once on a few rows; returns the seconds taken."""
    started = time.perf_counter()
    import pyarrow as pa

    from spark_state import chain
    from spark_state.format import datafile
    from spark_state.keygroups import key_groups_of
    from spark_state.spark import files  # noqa: F401 - the imports are the point
    from spark_state.storage import directory, filesystem, memory  # noqa: F401
    from spark_state.worker.protocol import ipc_to_table, table_to_ipc

    key = pa.struct([("k", pa.int64())])
    value = pa.struct([("v", pa.int64()), ("s", pa.string())])
    hashes = pa.array([7, -3, 11], pa.int32())
    rows = pa.table({
        "kg": pa.array(key_groups_of(hashes, 64), pa.int32()),
        "hash": hashes,
        "key": pa.array([{"k": 1}, {"k": 2}, {"k": 3}], key),
        "value": pa.array([{"v": 1, "s": "a"}, {"v": 2, "s": "b"}, None], value),
    })
    rows = ipc_to_table(table_to_ipc(rows).to_pybytes())              # the commit's request body
    encoded = datafile.encode(rows.filter(rows.column("value").is_valid()))   # a commit's file
    base = datafile.decode(encoded.data, "warm-up", 64)
    chain.merge_chain([base, rows], ordered=False)                    # a restore of a chain
    return time.perf_counter() - started


#: Checkpoint roots whose storage backend a warm-up was started for (once per root and worker).
_WARMED_ROOTS: set[str] = set()
_WARMED_LOCK = threading.Lock()


def warm_storage(root: str, fsync: bool = True) -> bool:
    """Makes the filesystem of a remote checkpoint root ready: imports its fsspec backend and creates the
    instance stores of this root will get (fsspec caches it by its options), with its client when it has one
    (s3fs: ``connect`` loads botocore's service model), then asks whether the root exists. That one request runs
    the client's request path once (signing, the HTTP session, its first connection): on S3, ~0.4 s of imports
    and set-up and ~40 ms of a first request (benchmarks/results/remote-restore/) that would otherwise sit inside
    the first restore or commit of the worker. False for a local root."""
    from spark_state.storage.filesystem import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(root, fsync=fsync)
    if not storage.remote:
        return False
    fs = storage.fs
    connect = getattr(fs, "connect", None)
    if callable(connect) and hasattr(fs, "set_session"):   # an async filesystem's session, made without I/O
        connect()
    storage.root_exists()
    return True


def warm_storage_in_background(settings) -> threading.Thread | None:
    """Starts ``warm_storage`` for the root a request's settings name (``checkpointRoot``; the shim validates
    its options when a provider starts and when the executor plugin prestarts the worker), once per root."""
    root = settings.checkpoint_root
    if not root or settings.storage != "filesystem" or not enabled():
        return None
    with _WARMED_LOCK:
        if root in _WARMED_ROOTS:
            return None
        _WARMED_ROOTS.add(root)

    def run():
        started = time.perf_counter()
        try:
            if warm_storage(root, settings.fsync):
                log.info("storage warm-up of %s done in %.0f ms", root, (time.perf_counter() - started) * 1000)
        except Exception as err:  # noqa: BLE001 - best effort; the first request pays the cost instead
            log.info("storage warm-up of %s failed (%s); the first request sets it up", root, err)

    thread = threading.Thread(target=run, name="storage-warm-up", daemon=True)
    thread.start()
    return thread


def start_in_background() -> threading.Thread | None:
    if not enabled():
        return None

    def run():
        try:
            log.info("warm-up done in %.0f ms", warm_up() * 1000)
        except Exception:  # noqa: BLE001 - best effort; the first request pays the cost instead
            log.warning("warm-up failed; the first request imports what it needs", exc_info=True)

    thread = threading.Thread(target=run, name="warm-up", daemon=True)
    thread.start()
    return thread
