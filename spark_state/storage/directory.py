"""A directory on any fsspec filesystem, addressed by relative paths: what the lifecycle tools
(inspect, validate, savepoint, restore, rescale) read and write outside the worker.

Writes are durable on local disks and a rewritten file replaces the old one
atomically where the filesystem allows (``spark_state.storage.atomic``, the
worker's records' implementation): restore, savepoint and rescale write
checkpoints a query will run on. A rewrite also drops the Hadoop checksum
companion (``.<name>.crc``) of the file it replaces: Hadoop's local
filesystem verifies a ``.crc`` when it exists and reads the file unverified
when it does not, so a stale companion would make Spark refuse a correct file.
"""

from __future__ import annotations

import posixpath

import fsspec

from spark_state.errors import StorageError
from spark_state.storage import atomic
from spark_state.storage.urls import as_url


def crc_companion(rel: str) -> str:
    """Hadoop's checksum file of `rel`: ``dir/.name.crc``."""
    head, name = posixpath.split(rel)
    return posixpath.join(head, f".{name}.crc")


def _raise_unless_gone(err: Exception) -> None:
    """A listing error other than a directory removed while it was walked (a retention run)."""
    if not isinstance(err, FileNotFoundError):
        raise err


class Dir:
    """A directory (it need not exist yet) and the files below it, by path relative to it."""

    def __init__(self, url: str, fs=None, base: str | None = None):
        self.url = as_url(url) if base is None else url
        if fs is None:
            try:
                # no listings cache: a long-lived process (a driver that rescales, then saves a point) would
                # otherwise take a file written since it last listed its folder for missing (s3fs looks a
                # file up in a cached listing before asking S3), as FileSystemCheckpointStorage does
                fs, base = fsspec.core.url_to_fs(self.url, use_listings_cache=False)
            except (ValueError, ImportError) as err:
                raise StorageError(
                    f"cannot open {self.url!r}: {err}. Use a URL fsspec knows, e.g. file:///data/ckpt or "
                    f"s3://bucket/ckpt (with s3fs installed)."
                ) from None
        self.fs = fs
        self.base = base.rstrip("/") or "/"
        self.local = atomic.is_local(fs)

    def __repr__(self) -> str:
        return f"Dir({self.url!r})"

    def full(self, rel: str = "") -> str:
        rel = rel.strip("/")
        return f"{self.base}/{rel}" if rel else self.base

    def url_of(self, rel: str = "") -> str:
        rel = rel.strip("/")
        return f"{self.url}/{rel}" if rel else self.url

    def child(self, rel: str) -> "Dir":
        return Dir(self.url_of(rel), self.fs, self.full(rel))

    # ------------------------------------------------------------- reading

    def exists(self, rel: str = "") -> bool:
        return self.fs.exists(self.full(rel))

    def read(self, rel: str) -> bytes:
        """A whole file; FileNotFoundError when it is missing."""
        return self.fs.cat_file(self.full(rel))

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.full(rel)))

    def listdir(self, rel: str = "") -> list[str]:
        """Names of the entries directly below `rel` (files and directories); [] when it is missing."""
        here = self.full(rel).rstrip("/")
        try:
            entries = self.fs.ls(here, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({posixpath.basename(e.rstrip("/")) for e in entries if e.rstrip("/") != here})

    def subdirs(self, rel: str = "") -> list[str]:
        """Names of the directories directly below `rel` (on an object store: the common prefixes); [] when missing."""
        here = self.full(rel).rstrip("/")
        try:
            entries = self.fs.ls(here, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({posixpath.basename(e["name"].rstrip("/")) for e in entries
                       if e.get("type") == "directory" and e["name"].rstrip("/") != here})

    def files(self, rel: str = "") -> dict[str, int]:
        """Every file below `rel`, as path relative to this directory -> size."""
        # fsspec's walk omits what it cannot list: a directory it may not read would look empty (local disks;
        # object stores raise on their own)
        checked = {"on_error": _raise_unless_gone} if self.local else {}
        try:
            found = self.fs.find(self.full(rel), detail=True, **checked)
        except FileNotFoundError:
            return {}
        strip = len(self.base.rstrip("/")) + 1
        out = {}
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            path = path.rstrip("/")
            if path.startswith(self.base.rstrip("/") + "/"):
                out[path[strip:]] = int(info.get("size") or 0)
        return out

    def is_empty(self) -> bool:
        """True when the directory is missing or holds no file at all (empty subdirectories are nothing)."""
        try:
            return not self.fs.find(self.full(), maxdepth=None)
        except FileNotFoundError:
            return True

    def occupied(self) -> str | None:
        """None when the directory is missing or holds no file; else what is in the way, for a refusal to write."""
        if self.is_empty():
            return None
        if self.fs.isfile(self.full()):
            return "it is a file"
        return f"it already holds files (e.g. {next(iter(sorted(self.files())), '?')})"

    # ------------------------------------------------------------- writing

    def _parent_of(self, full: str) -> None:
        parent = posixpath.dirname(full)
        if self.local:
            atomic.make_dirs(parent, fsync=True)
        elif not atomic.is_object_store(self.fs):
            self.fs.makedirs(parent, exist_ok=True)

    def write(self, rel: str, data: bytes) -> None:
        """Writes a whole file atomically where the filesystem allows, durably, dropping a stale ``.crc``."""
        full = self.full(rel)
        self._parent_of(full)
        atomic.replace_file(self.fs, full, data, fsync=True)
        self.delete(crc_companion(rel))

    def copy_in(self, rel: str, data: bytes) -> None:
        """Writes a file that did not exist (no companion to drop), durably: copies into a new location."""
        full = self.full(rel)
        self._parent_of(full)
        if self.local:
            atomic.write_local(full, data, fsync=True)
            atomic.fsync_dir(posixpath.dirname(full))
        else:
            self.fs.pipe_file(full, bytes(data))

    def delete(self, rel: str) -> None:
        try:
            self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            pass
