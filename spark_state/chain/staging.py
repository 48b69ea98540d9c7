"""A commit's data file written while its batch runs: the changes a shim streams (docs/protocol.md,
"Streamed commits") go into the file the commit will name as they arrive, so the commit itself only
finishes it (the last rows, the index, the fsync) and writes the manifest.

A staged file is one more unreferenced data file until its manifest lands: a crash or an abort leaves
what retention already collects (docs/consistency.md, rule 3), and nothing is visible before the
commit. Where a commit cannot use the file as written (a key streamed twice, a first version with
deletes, a base that needs the other kind of file) it takes the rows back and writes as before.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from spark_state.chain.context import StoreContext
from spark_state.errors import ProtocolError, StreamLost
from spark_state.faults import fault
from spark_state.format import datafile
from spark_state.format.manifest import DELTA, SNAPSHOT
from spark_state.format.tables import align, is_typed
from spark_state.storage.layout import new_file_path


class StagedCommit:
    """The streamed changes of one commit attempt of one version: a data file in arrival order being written.

    ``append`` takes one chunk (validated as a commit's changes are); ``finish`` completes the file; ``take_back``
    returns its rows instead. Thread-safe: chunks, the commit and an abort may come on different connections.
    """

    def __init__(self, ctx: StoreContext, version: int, validate, compression_level: int, full: bool = False):
        self.ctx = ctx
        self.version = version
        #: version 1 builds on nothing, and a whole state (`full`) on nothing before it: their file is the
        #: snapshot (deltas need a snapshot before them)
        self.kind = SNAPSHOT if version == 1 or full else DELTA
        self.path = new_file_path(version, self.kind)
        self._validate = validate
        self._lock = threading.Lock()
        self._file = ctx.storage.open_data_file(self.path)
        self._encoder = datafile.StreamEncoder(self._file.write, compression_level)
        self._done = False
        self.chunks = 0
        self.touched = time.monotonic()

    @property
    def rows(self) -> int:
        return self._encoder.rows

    @property
    def deletes(self) -> int:
        return self._encoder.deletes

    def append(self, changes: pa.Table, seq: int | None = None) -> bool:
        """Writes chunk `seq` (default: the next) of the changes; storage makes it durable in the background of
        the batch. False for a chunk already taken (a retried request); StreamLost when chunks before it are
        missing. The check and the write are one step, so two attempts of one chunk never both write."""
        changes = self._checked(changes)
        with self._lock:
            self._check_open()
            seq = self.chunks if seq is None else seq
            if seq < self.chunks:
                return False
            if seq > self.chunks:
                raise StreamLost(f"the streamed changes of {self.ctx.name} version {self.version}: chunk {seq} came "
                                 f"after {self.chunks} chunk(s); send them again")
            self._write(changes)
            self._file.sync()
            self.chunks += 1
            self.touched = time.monotonic()
        fault("stage-after-chunk")
        return True

    def finish(self, tail: pa.Table):
        """Appends the last changes (`tail`, as the commit validated them) and completes the file (durable when it
        returns); what its manifest entry records (``datafile.StreamedFile``)."""
        tail = self._typed(tail)
        with self._lock:
            self._check_open()
            self._done = True
            try:
                self._write(tail)
                written = self._encoder.finish()
                self._file.close()
            except BaseException:
                self._file.discard()
                raise
            return written

    def take_back(self, tail: pa.Table) -> pa.Table:
        """Every row streamed, then `tail`, as one table (the file is dropped): for a commit that writes its
        file another way."""
        with self._lock:
            self._check_open()
            self._done = True
            if not self._encoder.rows:
                self._file.discard()
                return tail
            try:
                self._encoder.finish()
                self._file.close()
            except BaseException:
                self._file.discard()
                raise
        try:
            data = self.ctx.storage.read_file(self.path)
            rows = datafile.decode(data, self.path, self.ctx.settings.max_parallelism, verified=True)
        finally:
            self.ctx.storage.delete_files([self.path])
        if not tail.num_rows:
            return rows
        return pa.concat_tables(align([rows, tail.select(rows.column_names)]))

    def _checked(self, changes: pa.Table) -> pa.Table:
        return self._typed(self._validate(changes))

    def _typed(self, changes: pa.Table) -> pa.Table:
        if changes.num_rows and not is_typed(changes):
            raise ProtocolError(f"streamed changes of {self.ctx.name} must be typed (file format 2); opaque rows "
                                f"are sent whole with the commit")
        return changes

    def _write(self, changes: pa.Table) -> None:
        try:
            self._encoder.write(changes)
        except ValueError as err:
            raise ProtocolError(f"a chunk of changes of {self.ctx.name} version {self.version}: {err}") from None

    def counted(self, chunks: int) -> bool:
        """Whether exactly `chunks` chunks are in the file (what a commit of the stream says it sent)."""
        with self._lock:
            return self.chunks == chunks

    def discard(self) -> None:
        """Drops the file (an aborted attempt, a stream nobody committed); idempotent."""
        with self._lock:
            if not self._done:
                self._done = True
                self._file.discard()

    def _check_open(self) -> None:
        if self._done:
            raise ProtocolError(f"the streamed changes of {self.ctx.name} version {self.version} were already "
                                f"committed or dropped")
