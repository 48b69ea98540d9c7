"""FileSystemCheckpointStorage: a store's files on any fsspec filesystem (file, memory, s3, gcs, …).

Manifests are made visible atomically: on a local filesystem by writing a
temporary file next to ``_metadata`` and renaming it over (``os.replace``); on
object stores a single PUT is already all-or-nothing. Files are not fsync'ed:
a commit survives the worker or executor dying (the page cache does), like
Spark's own HDFS-backed store on a local disk, but not a kernel crash.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Iterable, Sequence

import fsspec
from fsspec.implementations.local import LocalFileSystem

from spark_state.errors import StorageError
from spark_state.storage.base import MANIFEST_NAME, CheckpointStorage, manifest_path, version_dir_of

log = logging.getLogger(__name__)


class FileSystemCheckpointStorage(CheckpointStorage):
    kind = "filesystem"

    def __init__(self, root: str, **storage_options):
        super().__init__(root)
        try:
            self.fs, path = fsspec.core.url_to_fs(root, **storage_options)
        except (ValueError, ImportError) as err:
            raise StorageError(
                f"cannot use checkpoint storage URL {root!r}: {err}. Use a URL fsspec knows, e.g. "
                f"file:///data/ckpt or s3://bucket/path (with s3fs installed)."
            ) from None
        self._base = path.rstrip("/") or "/"
        self._local = isinstance(self.fs, LocalFileSystem)
        self._made_dirs: set[str] = set()

    def _full(self, rel: str) -> str:
        return f"{self._base}/{rel}"

    def _makedirs(self, directory: str) -> None:
        if directory not in self._made_dirs:
            self.fs.makedirs(directory, exist_ok=True)
            self._made_dirs.add(directory)

    # ------------------------------------------------------------- writing

    def init_version(self, version: int) -> None:
        if self._local:
            self._makedirs(self._full(f"chk-{version}"))

    def write_file(self, path: str, data: bytes) -> None:
        full = self._full(path)
        if self._local:
            self._makedirs(full.rsplit("/", 1)[0])
            with open(full, "wb") as f:
                f.write(data)
        else:
            self.fs.pipe_file(full, bytes(data) if not isinstance(data, bytes) else data)

    def commit_manifest(self, version: int, data: bytes) -> None:
        self.init_version(version)
        final = self._full(manifest_path(version))
        if self._local:
            tmp = f"{final}.tmp-{secrets.token_hex(6)}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, final)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        else:
            self.fs.pipe_file(final, data)

    # ------------------------------------------------------------- reading

    def read_manifest(self, version: int) -> bytes:
        try:
            return self.fs.cat_file(self._full(manifest_path(version)))
        except FileNotFoundError:
            raise self.version_not_found(version) from None

    def _missing(self, path: str) -> StorageError:
        return StorageError(
            f"state file {self._full(path)} named by a manifest of {self.root} is missing; something outside "
            f"spark_state deleted it. Restore an older version or start from a new checkpoint."
        )

    def read_file(self, path: str) -> bytes:
        try:
            return self.fs.cat_file(self._full(path))
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
            return self.fs.cat_ranges([full] * len(ranges), [r[0] for r in ranges], [r[1] for r in ranges],
                                      on_error="raise")
        except FileNotFoundError:
            raise self._missing(path) from None

    def list_manifests(self) -> dict[int, str]:
        try:
            found = self.fs.glob(self._full(f"chk-*/{MANIFEST_NAME}"), detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for name, info in found.items():
            version = version_dir_of(name.rstrip("/").split("/")[-2])
            if version is None:
                continue
            stamp = [info.get("size"), info.get("mtime"), info.get("created"), info.get("ino"),
                     info.get("ETag") or info.get("etag"), info.get("LastModified") or info.get("updated")]
            out[version] = ":".join(str(s) for s in stamp)
        return out

    def list_files(self, prefix: str = "shared") -> list[str]:
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
        for target, recursive in ((self._full(manifest_path(version)), False), (self._full(f"chk-{version}"), True)):
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
