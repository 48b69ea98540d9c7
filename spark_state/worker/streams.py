"""The commits being streamed to this worker: a shim's chunks of changes by stream id, until the commit or
abort that ends them (docs/protocol.md, "Streamed commits").

A stream lives in this process only: after a worker restart its chunks are gone and the shim, which keeps
them until its commit, sends them again (``StreamLost``). A stream nobody ends (its executor died
mid-batch) is dropped after ``IDLE_LIMIT``, its file with it.
"""

from __future__ import annotations

import logging
import threading
import time

from spark_state.chain.staging import StagedCommit
from spark_state.errors import ProtocolError, StreamLost

log = logging.getLogger(__name__)

#: A stream without a chunk, commit or abort for this long is dropped (a shim waits for each chunk's reply,
#: so only a dead or stuck task goes this quiet); every stream request sweeps.
IDLE_LIMIT = 15 * 60.0


class StreamRegistry:
    """Open streams by id; each is one attempt's commit of one version of one store."""

    def __init__(self, idle_limit: float = IDLE_LIMIT):
        self._streams: dict[str, StagedCommit] = {}
        self._lock = threading.Lock()
        self.idle_limit = idle_limit

    def append(self, stream: str, seq: int, store, version: int, chunk, full: bool = False) -> StagedCommit:
        """Chunk `seq` (from 0) of `stream` (`full`: of a whole state, written as a snapshot); a repeat of a chunk
        already taken (a retried request) is ignored. StreamLost when earlier chunks are not here."""
        self._expire()
        with self._lock:
            entry = self._streams.get(stream)
            if entry is None and seq == 0:
                entry = self._streams[stream] = store.stage(version, full)
        if entry is None:
            raise StreamLost(f"stream {stream} of {store.name} version {version}: chunk {seq} came but this worker "
                             f"holds none before it (it was restarted, or the stream expired); send them again")
        staged = entry
        self._check(stream, staged, store, version)
        staged.append(chunk, seq)   # a chunk taken before (a retried request) is not written twice
        return staged

    def take(self, stream: str, chunks: int, store, version: int) -> StagedCommit:
        """The stream a commit completes, once it holds all `chunks` chunks."""
        self._expire()
        with self._lock:
            entry = self._streams.pop(stream, None)
        if entry is None:
            raise StreamLost(f"the {chunks} chunk(s) streamed for {store.name} version {version} are not in this "
                             f"worker (it was restarted, or the stream expired); send them again")
        staged = entry
        try:
            self._check(stream, staged, store, version)
        except BaseException:
            staged.discard()   # out of the registry now: no abort could find it
            raise
        if not staged.counted(chunks):
            staged.discard()
            raise StreamLost(f"stream {stream} of {store.name} version {version} holds {staged.chunks} of the "
                             f"{chunks} chunk(s) its commit counts; send them again")
        return staged

    def drop(self, stream: str) -> bool:
        """Drops a stream and its file (an abort); whether there was one."""
        self._expire()
        with self._lock:
            entry = self._streams.pop(stream, None)
        if entry is not None:
            entry.discard()
        return entry is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    @staticmethod
    def _check(stream: str, staged: StagedCommit, store, version: int) -> None:
        if staged.ctx.name != store.name or staged.version != version:
            raise ProtocolError(f"stream {stream} belongs to {staged.ctx.name} version {staged.version}, not to "
                                f"{store.name} version {version}")

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [s for s, staged in self._streams.items() if now - staged.touched > self.idle_limit]
            dropped = [self._streams.pop(s) for s in idle]
        for staged in dropped:
            log.warning("dropping the streamed changes of %s version %d: no chunk, commit or abort for %.0f s",
                        staged.ctx.name, staged.version, self.idle_limit)
            staged.discard()
