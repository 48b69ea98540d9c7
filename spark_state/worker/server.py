"""The worker's request handling: one thread per shim connection, one dispatcher for all.

Commits and loads run on the connection's thread (they are on Spark's critical
path); compaction and retention are queued to one background thread
(``spark_state.worker.background``), so heavy work never sits inside a commit.
A commit that leaves its chain due for compaction queues it at once rather
than waiting for Spark's next maintenance call (every 60 s): a query stopped
right after a large batch restarts from a compacted chain with its row image.
"""

from __future__ import annotations

import hmac
import logging
import os
import socketserver
import tempfile
import threading
import time
from functools import lru_cache

import pyarrow as pa

import spark_state
from spark_state.errors import ProtocolError, SparkStateError
from spark_state.options import Settings
from spark_state.worker import warmup
from spark_state.worker.background import BackgroundWork
from spark_state.worker.deferred import DeferredRegistry
from spark_state.worker.streams import StreamRegistry
from spark_state.worker.protocol import (
    HELLO_MAX_HEADER, PROTOCOL_VERSION, IpcBody, Pieces, ipc_to_table, read_frame, write_frame,
)

log = logging.getLogger("spark_state.worker")

_RELEASE_AFTER_BYTES = 16 * 1024 * 1024


@lru_cache(maxsize=256)
def _settings(items: frozenset) -> Settings:
    return Settings.from_conf(dict(items))


def settings_of(header: dict) -> Settings:
    options = header.get("options") or {}
    if not isinstance(options, dict):
        raise ProtocolError("'options' must be a JSON object of option name -> string value")
    return _settings(frozenset((str(k), str(v)) for k, v in options.items()))


def store_ref_of(header: dict):
    """The StoreRef a request names; without a query id (readers) the checkpoint's metadata supplies it."""
    from spark_state.spark.files import read_query_id
    from spark_state.storage.layout import DEFAULT_STORE, StoreRef

    store = header.get("store")
    if not isinstance(store, dict):
        raise ProtocolError(f"request {header.get('op')!r} needs a 'store' object")
    try:
        spark_root = str(store["sparkRoot"])
        query_id = store.get("queryId") or read_query_id(spark_root)
        return StoreRef(
            spark_root=spark_root,
            location=str(store["location"]),
            operator=int(store["operator"]),
            partition=int(store["partition"]),
            name=str(store.get("name") or DEFAULT_STORE),
            query_id=str(query_id) if query_id else None,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise ProtocolError(f"malformed 'store' in request: {err!r}") from None


def _int_field(header: dict, name: str) -> int:
    try:
        return int(header[name])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ProtocolError(f"request {header.get('op')!r} needs an integer {name!r}") from None


def _stream_field(header: dict) -> str:
    stream = header.get("stream")
    if not isinstance(stream, str) or not 0 < len(stream) <= 128:
        raise ProtocolError(f"request {header.get('op')!r} needs a 'stream' id (a string of 1 to 128 characters)")
    return stream


def _optional_int(header: dict, name: str) -> int | None:
    return None if header.get(name) is None else _int_field(header, name)


def _optional_count(header: dict, name: str) -> int | None:
    """A count field: absent or null (unknown), else a JSON integer >= 0 (no string, float or boolean)."""
    value = header.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"request {header.get('op')!r}: {name!r} must be an integer >= 0 or absent, got {value!r}")
    return value


def _maintenance_status(store) -> dict:
    """What a shim reports as a metric and a warning: consecutive failed maintenance runs and the last error."""
    return {"maintenanceFailures": store.maintenance_failures, "maintenanceError": store.maintenance_error}


class Dispatcher:
    """Turns one request (header, body) into one response (header, body)."""

    def __init__(self, secret: str, cache_dir: str | None = None):
        self._secret = secret.encode()
        #: where row images of remote storage are copied for the JVM (the worker's private directory)
        self.cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), f"spark-state-images-{os.getpid()}")
        self.background = BackgroundWork()
        self.streams = StreamRegistry()
        self.deferred = DeferredRegistry()

    def authenticate(self, header: dict) -> bool:
        return (
            header.get("op") == "hello"
            and hmac.compare_digest(str(header.get("secret", "")).encode(), self._secret)
        )

    def handle(self, header: dict, body: bytes) -> tuple[dict, bytes | pa.Buffer | IpcBody]:
        op = header.get("op")
        method = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if method is None:
            raise ProtocolError(f"unknown request {op!r}")
        self.deferred.sweep()
        return method(header, body)

    def _in_background(self, kind: str, store, job, argument, merge=lambda old, new: new) -> bool:
        """Queues ``job(argument)`` of `store` (BackgroundWork.submit, keyed by `kind` and the store); the store
        stays busy until it has run, so the worker does not drop it as idle meanwhile and open a second object
        of it whose compaction would run beside this one's with locks and pins of its own."""
        locks = store.ctx.locks
        locks.queued(1)

        def run(arg):
            try:
                job(arg)
            finally:
                locks.queued(-1)

        queued = False
        try:
            queued = self.background.submit((kind, store), run, argument, merge)
        finally:
            if not queued:   # merged into the job already waiting (which holds the store), or not queued at all
                locks.queued(-1)
        return queued

    @staticmethod
    def release_memory(size: int) -> None:
        """Hands memory of a large request back to the OS: Arrow's allocator otherwise keeps it."""
        if size >= _RELEASE_AFTER_BYTES:
            pa.default_memory_pool().release_unused()

    def op_hello(self, header, body):
        return {"ok": True, "pid": os.getpid(), "version": spark_state.__version__,
                "protocol": PROTOCOL_VERSION}, b""

    def op_validate(self, header, body):
        """Checks a set of options; answers what the shim needs of them in the one parser there is."""
        settings = settings_of(header)
        warmup.warm_storage_in_background(settings)   # a remote checkpointRoot: its backend, before the first load
        return {"ok": True, "memoryLimit": settings.memory_limit, "imageCacheSize": settings.row_image_cache_size}, b""

    def _store(self, header):
        from spark_state.chain import open_store

        return open_store(store_ref_of(header), settings_of(header))

    def op_stage(self, header, body):
        """One chunk of a commit's changes, streamed while the batch runs, or of a whole state (``full``)
        (docs/protocol.md, "Streamed commits"): written into the data file the commit will name."""
        version = _int_field(header, "version")
        staged = self.streams.append(_stream_field(header), _int_field(header, "seq"), self._store(header), version,
                                     ipc_to_table(body), full=bool(header.get("full", False)))
        return {"ok": True, "rows": staged.rows}, b""

    def op_commit(self, header, body):
        """Makes a version durable: its changes are the body, after the chunks streamed as ``stream`` if named."""
        from spark_state.chain import UNCHECKED
        from spark_state.format.tables import CHANGES_SCHEMA

        version = _int_field(header, "version")
        changes = ipc_to_table(body) if body else CHANGES_SCHEMA.empty_table()
        base = header["baseCommitId"] if "baseCommitId" in header else UNCHECKED
        keep = _optional_int(header, "minVersionsToRetain")
        full = bool(header.get("full", False))
        started = time.perf_counter()
        keys = _optional_count(header, "keys")   # every field checked before a stream is taken: once taken, only
        store = self._store(header)                # the commit below discards it
        staged = None
        if header.get("stream") is not None:
            staged = self.streams.take(_stream_field(header), _int_field(header, "chunks"), store, version)
        result = store.commit(version, changes, base_commit_id=base, min_versions_to_retain=keep, full=full,
                              repeated_keys=bool(header.get("repeatedKeys")), staged=staged,
                              keys=keys, lineage=bool(header.get("lineage")))
        if result.compaction_due:   # at once, in the background; a waiting compaction takes the newer version
            self._in_background("compaction", store, store.compact, version, max)
        # "files": what a commit writes, a data file and a manifest (a field of protocol 1, kept for the shim)
        return {"ok": True, "bytes": result.bytes_written, "files": 2, "commitId": result.commit_id,
                "ms": round((time.perf_counter() - started) * 1000, 3), **_maintenance_status(store)}, b""

    def op_load(self, header, body):
        """A version's rows and commit id; only the id when the shim still holds that very commit. The rows are
        serialised onto the socket as it drains (IpcBody), so the JVM decodes while the worker writes.

        ``images: true`` (a shim that looks keys up in row images): when the version's chain has one, the reply
        names the image and the rows are only the changes after it, deletes kept (``image``): a local file, or
        with ``ranges: true`` (the shim fetches blocks with ``fetch``) an image on remote storage, named by its
        path in the store, the body starting with its tail (docs/protocol.md, "Row images on remote storage").
        ``keys``: the version's exact key count when known without walking the state (absent otherwise).
        ``bytesRead``: bytes of checkpoint data files the load read from storage (``Loaded.bytes_read``)."""
        version = _int_field(header, "version")
        known = header.get("commitId")
        known = str(known) if known else None
        lineage = header.get("checkpointId")
        if lineage is not None and not isinstance(lineage, str):
            raise ProtocolError(f"request 'load' needs 'checkpointId' as a string, got {lineage!r}")
        store = self._store(header)
        if header.get("images"):
            loaded = store.load_lazy(version, known, cache_dir=self.cache_dir, ranges=bool(header.get("ranges")),
                                     lineage=lineage or None, defer=bool(header.get("defer")))
        else:
            loaded = store.load_checked(version, known, ordered=False, lineage=lineage or None)
        counts = {"bytesRead": loaded.bytes_read, **({} if loaded.keys is None else {"keys": loaded.keys})}
        if loaded.table is None and loaded.image is None:
            return {"ok": True, "unchanged": True, "commitId": loaded.commit_id, **counts}, b""
        reply = {"ok": True, "rows": 0 if loaded.table is None else loaded.table.num_rows,
                 "commitId": loaded.commit_id, **counts}
        rows = None if loaded.table is None else IpcBody(loaded.table)
        if loaded.image is None:
            return reply, (b"" if rows is None else rows)
        image = loaded.image
        reply["image"] = {"rows": image.rows, "size": image.size, "fileFormat": int(loaded.file_format)}
        if not image.remote:
            reply["image"].update(path=image.path, temporary=image.temporary)
            return reply, (b"" if rows is None else rows)
        tail = image.tail
        reply["image"].update(file=image.file, id=f"{store.storage.root}/{image.file}", checksum=image.checksum,
                              tail=[list(r) for r in tail.ranges])
        if loaded.deferred is not None:
            reply.update(rows=loaded.deferred.rows, deferred=self.deferred.put(loaded.deferred))
        return reply, Pieces(tail.data, rows)

    def op_changesAfterImage(self, header, body):
        """The changes of a deferred load (``deferred``: its token), deletes as null values: from the background
        read the load started, or, on a worker that has none (a new one), read now from the version, commit id and
        image the request names; StaleState when storage no longer holds that commit over that image."""
        version = _int_field(header, "version")
        commit_id, image, token = header.get("commitId"), header.get("file"), header.get("deferred")
        lineage = header.get("checkpointId")
        if not all(isinstance(v, str) and v for v in (commit_id, image, token)) \
                or not (lineage is None or isinstance(lineage, str)):
            raise ProtocolError("request 'changesAfterImage' needs 'deferred', 'commitId' and 'file' as strings "
                                "(and 'checkpointId' as a string, if any)")
        store = self._store(header)
        deferred = self.deferred.take(token)
        if deferred is not None:
            table, read = deferred.result()
        else:
            table, read = store.reader.changes_after(version, commit_id, image, lineage or None)
        rows = 0 if table is None else table.num_rows
        return {"ok": True, "rows": rows, "bytesRead": read}, (b"" if table is None else IpcBody(table))

    #: A fetch asks for at most this many ranges and bytes: a filler's request is a few MiB.
    FETCH_MAX_RANGES = 4096
    FETCH_MAX_BYTES = 256 << 20

    def op_fetch(self, header, body):
        """Byte ranges of a file of the store (a remote row image the shim reads by range): the body is their
        bytes one after the other, ``lengths`` says how many each has (exactly what was asked for)."""
        path = header.get("file")
        if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path \
                or any(part in ("", ".", "..") for part in path.split("/")):
            raise ProtocolError(f"request 'fetch' needs a 'file' relative to the store's root, got {path!r}")
        ranges = header.get("ranges")
        if not isinstance(ranges, list) or not 0 < len(ranges) <= self.FETCH_MAX_RANGES:
            raise ProtocolError(f"request 'fetch' needs 1 to {self.FETCH_MAX_RANGES} 'ranges'")
        checked = []
        for r in ranges:
            if not (isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r) and 0 <= r[0] < r[1]):
                raise ProtocolError(f"request 'fetch': a range is [start, end) with 0 <= start < end, got {r!r}")
            checked.append((r[0], r[1]))
        total = sum(b - a for a, b in checked)
        if total > self.FETCH_MAX_BYTES:
            raise ProtocolError(f"request 'fetch' asks for {total} bytes, more than {self.FETCH_MAX_BYTES} at once")
        chunks = self._store(header).reader.fetch(path, checked)
        return {"ok": True, "lengths": [len(c) for c in chunks]}, Pieces(chunks)

    def op_changes(self, header, body):
        """The changes `version`'s commit recorded (deletes as null values), for Spark's change feed. With
        ``through``, first checks that every version up to it has its changes recorded (HistoryUnavailable
        names those that do not), so a feed fails before its first row rather than part-way."""
        version = _int_field(header, "version")
        through = _optional_int(header, "through")
        history = self._store(header).history
        if through is not None:
            history.recorded(version, through)
        [(_, table)] = history.changes(version, version)
        return {"ok": True, "rows": table.num_rows}, IpcBody(table)

    def op_replay(self, header, body):
        """The state at `version` rebuilt from the state at `snapshotVersion` and the changes recorded after it
        (Spark's snapshot replay), with `version`'s commit id."""
        version = _int_field(header, "version")
        store = self._store(header)
        table = store.history.replay(_int_field(header, "snapshotVersion"), version)
        commit_id = store.reader.read_manifest(version).commit_id if version in store.versions() else None
        return {"ok": True, "rows": table.num_rows, "commitId": commit_id}, IpcBody(table)

    def op_latest(self, header, body):
        return {"ok": True, "version": self._store(header).latest_version()}, b""

    def op_abort(self, header, body):
        """Drops what this worker holds of an uncommitted version: the chunks streamed as ``stream`` if named,
        files it wrote for the version that no manifest names."""
        if header.get("stream") is not None:
            self.streams.drop(_stream_field(header))
        self._store(header).abort(_int_field(header, "version"))
        return {"ok": True}, b""

    def op_maintenance(self, header, body):
        keep = _int_field(header, "minVersionsToRetain")
        version = _optional_int(header, "version")
        store = self._store(header)
        # one waiting run per store is enough: it takes the newest request's arguments
        queued = self._in_background("maintenance", store, lambda args: store.maintenance(*args), (keep, version))
        return {"ok": True, "queued": queued, **_maintenance_status(store)}, b""

    def op_drain(self, header, body):
        """Waits until the background work queued so far is done (the executor is shutting down), at most
        ``timeoutMs``; answers how many jobs are still queued or running."""
        timeout_ms = _int_field(header, "timeoutMs")
        if timeout_ms < 0:
            raise ProtocolError(f"request 'drain' needs 'timeoutMs' >= 0, got {timeout_ms}")
        return {"ok": True, "pending": self.background.drain(timeout_ms / 1000)}, b""

    def op_shutdown(self, header, body):
        threading.Thread(target=_exit_soon, daemon=True).start()
        return {"ok": True}, b""

    def close(self):
        self.background.close()


def _exit_soon():
    time.sleep(0.05)
    os._exit(0)


class _Connection(socketserver.StreamRequestHandler):
    """One shim connection: hello first, then request/response frames until EOF."""

    wbufsize = 1 << 16

    def finish(self):
        """Flushes and closes; a peer gone mid-reply (a task killed during a large load) is no error to log."""
        try:
            super().finish()
        except OSError:
            pass

    def handle(self):
        dispatcher: Dispatcher = self.server.dispatcher
        try:
            try:
                first = read_frame(self.rfile, max_header=HELLO_MAX_HEADER, max_body=0)   # nothing big before auth
            except ProtocolError as err:
                write_frame(self.wfile, {"ok": False, "kind": "ProtocolError", "error": f"authentication failed: {err}"})
                return
            if first is None:
                return
            if not dispatcher.authenticate(first[0]):
                write_frame(self.wfile, {"ok": False, "kind": "ProtocolError",
                                         "error": "authentication failed: the first request must be hello with the worker's secret"})
                return
            write_frame(self.wfile, *dispatcher.op_hello(*first))
            while True:
                try:
                    frame = read_frame(self.rfile)
                except ProtocolError as err:   # the stream's framing is lost: say why, then hang up
                    write_frame(self.wfile, {"ok": False, "kind": "ProtocolError", "error": str(err)})
                    return
                if frame is None:
                    return
                header, body = self._respond(dispatcher, *frame)
                write_frame(self.wfile, header, body)
                dispatcher.release_memory(len(frame[1]) + len(body))
                del frame, body
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return

    @staticmethod
    def _respond(dispatcher, header, body):
        try:
            return dispatcher.handle(header, body)
        except SparkStateError as err:   # OptionError included
            return {"ok": False, "kind": type(err).__name__, "error": str(err)}, b""
        except ValueError as err:
            log.exception("request %s failed", header.get("op"))
            return {"ok": False, "kind": "InternalError", "error": str(err)}, b""
        except Exception as err:
            log.exception("request %s failed", header.get("op"))
            return {"ok": False, "kind": "InternalError",
                    "error": f"{type(err).__name__}: {err} (see the worker log)"}, b""


class WorkerServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, path: str, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        super().__init__(path, _Connection)
