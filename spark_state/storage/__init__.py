"""Checkpoint storages and the choice between them (``storage_for``)."""

from __future__ import annotations

import hashlib
import re

from spark_state.errors import StorageError
from spark_state.options import PREFIX, STORAGES, OptionError, Settings
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from spark_state.storage.memory import MemoryCheckpointStorage, clear_registry

__all__ = [
    "CheckpointStorage", "FileSystemCheckpointStorage", "MemoryCheckpointStorage",
    "checkpoint_digest", "clear_registry", "normalize_url", "resolve_root", "storage_for",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$")


def normalize_url(url: str) -> str:
    """Hadoop-style locations to fsspec URLs: 'file:/x' and '/x' -> 'file:///x'; others unchanged.

    Hadoop's ``Path.toUri`` writes local paths as ``file:/x`` (one slash),
    which fsspec would read as a relative path.
    """
    text = str(url).strip()
    if not text:
        raise StorageError("empty checkpoint location; Spark passed no state directory for this store.")
    if text.startswith("/"):
        return "file://" + "/" + text.lstrip("/")
    m = _SCHEME.match(text)
    if not m or len(m.group(1)) == 1:  # 'C:\\x' is a Windows drive, not a scheme
        raise StorageError(
            f"checkpoint location {url!r} is neither a URL nor an absolute path; use e.g. file:///data/ckpt "
            f"or s3://bucket/path."
        )
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "file":
        if rest.startswith("//"):
            rest = rest[2:]
            if not rest.startswith("/"):  # file://host/x: only the local host is meaningful
                host, _, rest = rest.partition("/")
                if host not in ("", "localhost"):
                    raise StorageError(f"checkpoint location {url!r} names a remote host; use file:///path.")
                rest = "/" + rest
        if not rest.startswith("/"):
            raise StorageError(f"checkpoint location {url!r} is a relative file URL; use file:///absolute/path.")
        return "file:///" + rest.lstrip("/")
    if not rest.startswith("//"):
        raise StorageError(f"checkpoint location {url!r} is malformed; expected {scheme}://...")
    return f"{scheme}:{rest}".rstrip("/") if rest.strip("/") else f"{scheme}:{rest}"


def checkpoint_digest(spark_root: str, query_id: str | None) -> str:
    """The directory name of one checkpoint's stores under a shared root.

    Spark's state directory tells two queries apart; the query id (from
    ``<checkpointLocation>/metadata``) tells a deleted and re-created checkpoint
    at the same path from the one before it, so the two timelines never mix.
    """
    identity = str(spark_root) if not query_id else f"{spark_root}\0{query_id}"
    return hashlib.sha1(identity.encode()).hexdigest()[:16]


def _under(base_url: str, ref) -> str:
    base = normalize_url(base_url).rstrip("/")
    return f"{base}/{checkpoint_digest(ref.spark_root, ref.query_id)}/{ref.operator}/{ref.partition}/{ref.name}"


def resolve_root(ref, settings: Settings) -> str:
    """The root URL of one store: Spark's own directory for it, or a private one under checkpoint_root.

    Spark's own directory goes away with the checkpoint, so it needs no query
    id; under a shared checkpoint_root, ``checkpoint_digest`` keeps queries and
    timelines apart and operator/partition/name keep their stores apart. Memory
    storage keys its in-process registry by the same root, so it gets the query id too.
    """
    if settings.checkpoint_root is None:
        root = normalize_url(ref.location).rstrip("/")
        return root if settings.storage != "memory" or not ref.query_id else f"{root}#{ref.query_id}"
    return _under(settings.checkpoint_root, ref)


def _metadata_url(ref, settings: Settings) -> str | None:
    return _under(settings.memory_metadata_dir, ref) if settings.memory_metadata_dir else None


def storage_for(ref, settings: Settings) -> CheckpointStorage:
    """The checkpoint storage settings.storage names, rooted where this store's files belong."""
    if settings.storage not in STORAGES:
        raise OptionError(f"{PREFIX}storage={settings.storage!r} is not known; use one of: {', '.join(STORAGES)}.")
    root = resolve_root(ref, settings)
    if settings.storage == "memory":
        return MemoryCheckpointStorage(root, settings.memory_max_state_size, _metadata_url(ref, settings))
    return FileSystemCheckpointStorage(root, fsync=settings.fsync)
