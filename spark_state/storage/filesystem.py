"""FileSystemCheckpointStorage: a store's files on any fsspec filesystem (file, memory, s3, gcs, …).

Records (manifests, compaction records) are replaced atomically
(``spark_state.storage.atomic`` says how, per filesystem). With ``fsync`` (the
default) local data files, records and the directories that name them reach
the disk before a commit is acknowledged, so a commit survives a kernel crash
or power loss, not only the worker or executor dying.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
from contextlib import contextmanager
from typing import Iterable, Sequence

import fsspec
import fsspec.utils

from spark_state.errors import FileMissing, StorageError, StoreDeleted
from spark_state.storage import atomic, instances
from spark_state.storage.base import CheckpointStorage, DataFileWriter
from spark_state.storage.layout import (COMPACTION_NAME, LINEAGE_PREFIX, MANIFEST_NAME, SHARED_DIR, lineage_of,
                                       record_path, version_dir_of)

log = logging.getLogger(__name__)

#: Errors of a write that storage has no room or no permission for.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})

class FileSystemCheckpointStorage(CheckpointStorage):
    kind = "filesystem"

    def __init__(self, root: str, *, fsync: bool = True, **storage_options):
        super().__init__(root)
        # Other processes write this store: fsspec's listings cache (kept for the life of the worker's
        # filesystem object) would hide their files from reads and listings here (s3fs looks a file up
        # in a cached listing of its directory before asking S3). Storage is the only shared truth.
        storage_options.setdefault("use_listings_cache", False)
        try:
            storage_options = instances.with_pool(fsspec.utils.get_protocol(root), storage_options)
            fs, path = fsspec.core.url_to_fs(root, **storage_options)
            self.fs = instances.shared(fs)
        except (ValueError, ImportError) as err:
            raise StorageError(
                f"cannot use checkpoint storage URL {root!r}: {err}. Use a URL fsspec knows, e.g. "
                f"file:///data/ckpt or s3://bucket/path (with s3fs installed)."
            ) from None
        self._base = path.rstrip("/") or "/"
        self._local = atomic.is_local(self.fs)
        self.remote = not self._local
        self._object_store = atomic.is_object_store(self.fs)
        self.fsync = fsync and self._local
        self._made_dirs: set[str] = set()

    def _full(self, rel: str) -> str:
        return f"{self._base}/{rel}"

    def _makedirs(self, directory: str) -> None:
        if directory not in self._made_dirs:
            atomic.make_dirs(directory, self.fsync)
            self._made_dirs.add(directory)

    def _write_local(self, full: str, data, recreate: bool = True) -> None:
        """Writes one local data file.

        A commit (``recreate``) makes a directory deleted behind our back again, once: after a
        checkpoint is deleted, the query started again at its path is a new timeline. Background
        work (``recreate=False``) never brings a deleted store back: a directory this process saw
        (made, or wrote into) and is gone now was deleted (StoreDeleted); one it never saw is made
        without parents (a store that never wrote a file has no shared/ yet; a store root that is
        gone stays gone).
        """
        directory = os.path.dirname(full)
        if not recreate:
            try:
                self._write_bytes(full, data)
            except FileNotFoundError:
                if directory in self._made_dirs:
                    raise self._deleted(directory) from None
                self._mkdir(directory)
                try:
                    self._write_bytes(full, data)
                except FileNotFoundError:
                    raise self._deleted(directory) from None
            self._made_dirs.add(directory)
            return
        for attempt in (1, 2):
            self._makedirs(directory)
            try:
                self._write_bytes(full, data)
                return
            except FileNotFoundError:
                self._made_dirs.discard(directory)
                if attempt == 2:
                    raise

    def _write_bytes(self, full: str, data) -> None:
        """One file's bytes, on the disk before it returns (``fsync``); makes no directory."""
        atomic.write_local(full, data, self.fsync)

    def _mkdir(self, directory: str) -> None:
        """One directory, never its parents."""
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise self._deleted(directory) from None
        else:
            if self.fsync:
                atomic.fsync_dir(os.path.dirname(directory))
        self._made_dirs.add(directory)

    def _deleted(self, directory: str) -> StoreDeleted:
        return StoreDeleted(f"{directory} is gone: the checkpoint {self.root} was deleted; background work "
                            f"of the query that used it does not bring it back")

    # ------------------------------------------------------------- writing

    def init_version(self, version: int) -> None:
        if self._local:
            self._makedirs(self._full(f"chk-{version}"))

    def write_file(self, path: str, data: bytes, *, recreate: bool = True) -> None:
        with self._writing(self._full(path)):
            self._write_file(path, data, recreate)

    def _write_file(self, path: str, data: bytes, recreate: bool) -> None:
        full = self._full(path)
        if self._local:
            self._write_local(full, data, recreate)
            if self.fsync:
                atomic.fsync_dir(os.path.dirname(full))
        else:
            # other directory filesystems (HDFS, sftp, …) make parents on write: look before writing
            if not recreate and not self._object_store and not self.fs.isdir(self._base):
                raise self._deleted(self._base)
            self.fs.pipe_file(full, bytes(data) if not isinstance(data, bytes) else data)

    def open_data_file(self, path: str, *, recreate: bool = True) -> DataFileWriter:
        if not self._local:
            return super().open_data_file(path, recreate=recreate)   # object stores put a file whole
        return _LocalDataFile(self, path, recreate)

    def commit_record(self, version: int, name: str, data: bytes, *, recreate: bool = True) -> None:
        with self._writing(self._full(record_path(version, name))):
            self._commit_record(version, name, data, recreate)

    @contextmanager
    def _writing(self, full: str):
        """A write that fails for want of space or permission (a full or read-only disk, a quota) raises a
        StorageError naming the file (OSError's message names none when write() or fsync() fails); other
        errors stay as they are (a missing directory: the callers decide)."""
        try:
            yield
        except OSError as err:
            if err.errno not in _NO_ROOM:
                raise
            raise StorageError(
                f"cannot write {full}: {err.strerror or err}. The checkpoint storage {self.root} is full, "
                f"read-only or not writable by this process. Free space or fix the permissions: the task "
                f"fails, and the query resumes from its last committed version."
            ) from err

    def _commit_record(self, version: int, name: str, data: bytes, recreate: bool) -> None:
        final = self._full(record_path(version, name))
        directory = os.path.dirname(final)
        write_temporary = None
        if self._local:
            # recreate: a commit makes a deleted chk-N/ again; else chk-N/ held the manifest, so a missing
            # one was deleted since and is never made again
            write_temporary = self._write_local if recreate else self._write_bytes
        elif not self._object_store:
            if recreate:
                self.fs.makedirs(directory, exist_ok=True)
            elif not self.fs.isdir(directory):
                raise self._deleted(directory)
        try:
            atomic.replace_file(self.fs, final, data, fsync=self.fsync, write_temporary=write_temporary)
        except FileNotFoundError:
            if recreate or not self._local:
                raise
            raise self._deleted(directory) from None

    # ------------------------------------------------------------- reading

    def read_version(self, version: int) -> tuple[bytes, bytes | None]:
        """Manifest and compaction record in one round trip on remote storage (both requests at once)."""
        if self._local:
            return super().read_version(version)
        from spark_state.storage.reads import read_pool

        record = read_pool().submit(self.read_record, version, COMPACTION_NAME)
        try:
            manifest = self.read_manifest(version)
        finally:
            compaction = record.result()
        return manifest, compaction

    def read_record(self, version: int, name: str) -> bytes | None:
        try:
            return self._cat(self._full(record_path(version, name)))
        except FileNotFoundError:
            return None

    #: Files up to this size are read from an object store in one request (see _cat).
    ONE_REQUEST_BYTES = 16 << 20

    def _cat(self, full: str, size: int | None = None) -> bytes:
        """A whole file. On an object store a file that is not known to be large is read as the range from
        byte 0: one GET, where s3fs asks for the object's size first (a HEAD, and on a missing object a
        listing too) to split a large one into concurrent parts. (S3 refuses the range of an empty object:
        that one is read again the usual way.)"""
        if self._object_store and (size is None or 0 < size <= self.ONE_REQUEST_BYTES):
            try:
                return self.fs.cat_file(full, start=0)
            except FileNotFoundError:
                raise
            except OSError:
                pass
        return self.fs.cat_file(full)

    def _missing(self, path: str) -> StorageError:
        return FileMissing(
            f"state file {self._full(path)} named by a manifest of {self.root} is missing; something outside "
            f"spark_state deleted it. Restore an older version or start from a new checkpoint."
        )

    def root_exists(self) -> bool:
        """Whether the root exists: one request on an object store (the worker's storage warm-up sends it to set
        its client's connection up before the first restore)."""
        return self.fs.exists(self._base)

    def read_file(self, path: str, size: int | None = None) -> bytes:
        try:
            return self._cat(self._full(path), size)
        except FileNotFoundError:
            raise self._missing(path) from None

    def local_path(self, path: str) -> str | None:
        return self._full(path) if self._local else None

    def download(self, path: str, to: str) -> None:
        try:
            self.fs.get_file(self._full(path), to)
        except FileNotFoundError:
            raise self._missing(path) from None

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        full = self._full(path)
        if self._local:
            try:
                with open(full, "rb") as f:
                    out = []
                    for start, end in ranges:
                        f.seek(start)
                        out.append(f.read(end - start))
                    return out
            except FileNotFoundError:
                raise self._missing(path) from None
        try:
            return self._cat_ranges(full, ranges)
        except FileNotFoundError:
            raise self._missing(path) from None
        except OSError:
            # an object store answers a range that starts past the object's end with an error (S3's 416,
            # "The requested range is not satisfiable": s3fs raises EINVAL; other backends raise otherwise), not
            # with fewer bytes: if the file is shorter than a range asks for, read what it has, else the error is
            # the storage's (its size costs one request more, on this failure path only)
            try:
                size = self.fs.size(full)
                if size is None or all(end <= size for _, end in ranges):
                    raise
                inside = [(start, min(end, size)) for start, end in ranges if start < size]
                chunks = iter(self._cat_ranges(full, inside) if inside else ())
            except FileNotFoundError:
                raise self._missing(path) from None
            return [next(chunks) if start < size else b"" for start, _ in ranges]

    def _cat_ranges(self, full: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if len(ranges) > 1 and not getattr(self.fs, "async_impl", False):
            # a blocking filesystem (HDFS, sftp, ...) reads ranges one after the other: read them at once
            from spark_state.storage.reads import read_pool

            return list(read_pool().map(lambda r: self.fs.cat_file(full, r[0], r[1]), ranges))
        return self.fs.cat_ranges([full] * len(ranges), [r[0] for r in ranges], [r[1] for r in ranges],
                                  on_error="raise")

    def list_records(self, name: str = MANIFEST_NAME) -> dict[int, str]:
        try:
            found = self._find_records(name)
        except FileNotFoundError:
            return {}
        out = {}
        for path, info in found.items():
            parts = path.rstrip("/").split("/")
            version = version_dir_of(parts[-2]) if len(parts) > 1 and parts[-1] == name else None
            if version is None:
                continue
            stamp = [info.get("size"), info.get("mtime"), info.get("created"), info.get("ino"),
                     info.get("ETag") or info.get("etag"), info.get("LastModified") or info.get("updated")]
            out[version] = ":".join(str(s) for s in stamp)
        return out

    def list_lineages(self) -> dict[tuple[int, str], str]:
        try:
            if self._object_store and "prefix" in inspect.signature(self.fs.find).parameters:
                found = self.fs.find(self._base, prefix="chk-", detail=True)
            else:
                found = self.fs.glob(self._full(f"chk-*/{LINEAGE_PREFIX}*"), detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for path, info in found.items():
            parts = path.rstrip("/").split("/")
            if len(parts) < 2:
                continue
            version, commit_id = version_dir_of(parts[-2]), lineage_of(parts[-1])
            if version is not None and commit_id is not None:
                out[(version, commit_id)] = f"{info.get('size')}:{info.get('mtime') or info.get('LastModified')}"
        return out

    def _find_records(self, name: str) -> dict[str, dict]:
        """Every ``chk-*/<name>`` with its details. On an object store whose fsspec filesystem lists by key prefix
        (s3fs, gcsfs) that is one listing of the keys under ``chk-``; ``glob`` would list every ``chk-N/``
        "directory" on its own, a request per version, which retention and every tool pay on each run."""
        if self._object_store and "prefix" in inspect.signature(self.fs.find).parameters:
            found = self.fs.find(self._base, prefix="chk-", detail=True)
            return {p: info for p, info in found.items() if p.endswith(f"/{name}")}
        return self.fs.glob(self._full(f"chk-*/{name}"), detail=True)

    def list_files(self, prefix: str = SHARED_DIR) -> list[str]:
        base = self._full(prefix.strip("/"))
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        strip = len(self._base.rstrip("/")) + 1
        return sorted(p[strip:] if p.startswith(self._base) else p for p in found)

    # ------------------------------------------------------------- deleting

    def delete_version(self, version: int) -> None:
        # The manifest first, so a crash mid-way leaves the version invisible rather than half-deleted.
        for target, recursive in ((self._full(record_path(version, MANIFEST_NAME)), False),
                                  (self._full(f"chk-{version}"), True)):
            try:
                self.fs.rm(target, recursive=recursive)
            except FileNotFoundError:
                pass
        self._made_dirs.discard(self._full(f"chk-{version}"))

    def delete_files(self, paths: Iterable[str]) -> None:
        for path in paths:
            try:
                self.fs.rm_file(self._full(path))
            except FileNotFoundError:
                pass
            log.debug("deleted %s", self._full(path))



class _LocalDataFile(DataFileWriter):
    """A data file on a local disk written as its pieces come: what was written reaches the disk in the
    background of the batch (``sync``, every ``SYNC_BYTES``), so the commit's fsync has only the tail to flush."""

    #: Bytes written between two syncs: a sync per small piece would cost more than the tail it saves.
    SYNC_BYTES = 8 << 20

    def __init__(self, storage: FileSystemCheckpointStorage, path: str, recreate: bool = True):
        super().__init__(path)
        self._storage = storage
        self._full = storage._full(path)
        self._unsynced = 0
        directory = os.path.dirname(self._full)
        with storage._writing(self._full):
            if not recreate:   # as background work's write_file: a directory seen and gone stays gone
                try:
                    self._file = self._open()
                except FileNotFoundError:
                    if directory in storage._made_dirs:
                        raise storage._deleted(directory) from None
                    storage._mkdir(directory)
                    try:
                        self._file = self._open()
                    except FileNotFoundError:
                        raise storage._deleted(directory) from None
                storage._made_dirs.add(directory)
                return
            for attempt in (1, 2):   # as a commit's write_file: a deleted directory is made again, once
                storage._makedirs(directory)
                try:
                    self._file = self._open()
                    break
                except FileNotFoundError:
                    storage._made_dirs.discard(directory)
                    if attempt == 2:
                        raise

    def _open(self):
        return open(self._full, "xb", buffering=1 << 20)

    def write(self, data: bytes) -> None:
        with self._storage._writing(self._full):
            self._file.write(data)
        self._unsynced += len(data)

    def sync(self) -> None:
        if self._storage.fsync and self._unsynced >= self.SYNC_BYTES:
            with self._storage._writing(self._full):
                self._file.flush()
                os.fdatasync(self._file.fileno())
            self._unsynced = 0

    def close(self) -> None:
        with self._storage._writing(self._full):
            self._file.flush()
            if self._storage.fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            if self._storage.fsync:
                atomic.fsync_dir(os.path.dirname(self._full))

    def discard(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass   # a full disk refuses the flush: the file goes anyway
        finally:
            try:
                os.unlink(self._full)
            except FileNotFoundError:
                pass
