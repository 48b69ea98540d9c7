"""Writing a whole file on any fsspec filesystem: durably, and where it replaces a file, atomically.

One implementation for the worker's records (``filesystem.py``) and the tools'
writes into Spark's checkpoint files (``directory.py``). How a replacement is
made atomic depends on the filesystem:

* object stores (s3, gcs, azure, …): one PUT is already all-or-nothing;
* a local disk: write a temporary file beside the target, fsync it, rename it
  over (``os.replace``), fsync the directory;
* any other filesystem (hdfs, webhdfs, sftp, …): write a temporary file, then
  ``mv`` it into place; where the filesystem refuses to rename over an
  existing file (HDFS), the old file is removed first, so a reader sees the
  old file, briefly none, or the new one, never a torn one.

With ``fsync`` (local disks only) the file and the directory that names it are
on the disk when a write returns, so it survives a kernel crash or power loss.
"""

from __future__ import annotations

import os
import posixpath
import secrets
from typing import Callable

from fsspec.implementations.local import LocalFileSystem

#: fsspec protocols whose single PUT replaces an object atomically.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "oci", "r2", "memory"})


def is_local(fs) -> bool:
    return isinstance(fs, LocalFileSystem)


def is_object_store(fs) -> bool:
    proto = fs.protocol
    protocols = {proto} if isinstance(proto, str) else set(proto)
    return not is_local(fs) and bool(protocols & OBJECT_STORES)


def fsync_dir(directory: str) -> None:
    """Makes a directory's entries (a new or renamed file) durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_local(full: str, data, fsync: bool) -> None:
    """One local file's bytes, on the disk before it returns (``fsync``); makes no directory."""
    with open(full, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def temporary_path(final: str) -> str:
    """A hidden name beside `final` (Spark's and Hadoop's listings skip it; the tools' copies leave it out)."""
    head, name = posixpath.split(final)
    return f"{head}/.{name}.{secrets.token_hex(6)}.tmp"


def replace_file(fs, final: str, data, *, fsync: bool,
                 write_temporary: Callable[[str, bytes], None] | None = None) -> None:
    """Writes `final` all or nothing, replacing a previous one (see the module docstring).

    The caller makes the parent directory where the filesystem needs one;
    ``write_temporary`` writes the local temporary file instead of a plain
    ``write_local`` (the worker's storage decides there whether a deleted
    directory may be made again).
    """
    if is_object_store(fs):
        fs.pipe_file(final, bytes(data))
        return
    tmp = temporary_path(final)
    try:
        if is_local(fs):
            (write_temporary or (lambda path, body: write_local(path, body, fsync)))(tmp, data)
            os.replace(tmp, final)
            if fsync:
                fsync_dir(os.path.dirname(final))
        else:
            fs.pipe_file(tmp, bytes(data))
            _rename_over(fs, tmp, final)
    except BaseException:
        try:
            fs.rm_file(tmp)
        except (FileNotFoundError, OSError):
            pass
        raise


def _rename_over(fs, tmp: str, final: str) -> None:
    try:
        fs.mv(tmp, final)
    except (FileExistsError, OSError):
        if not fs.exists(tmp):
            return   # the move happened and only its reply failed: `final` is ours, never remove it
        if not fs.exists(final):
            raise
        fs.rm_file(final)   # HDFS-like: rename does not replace
        fs.mv(tmp, final)


def make_dirs(directory: str, fsync: bool) -> None:
    """A local directory and its missing parents; with ``fsync``, each new one is durable in its parent."""
    missing = []
    here = directory.rstrip("/") or "/"
    while here and not os.path.isdir(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        if fsync:
            fsync_dir(os.path.dirname(path))
