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
    "clear_registry", "normalize_url", "resolve_root", "storage_for",
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


def resolve_root(ref, settings: Settings) -> str:
    """The root URL of one store: Spark's own directory for it, or a private one under checkpoint_root.

    Under a shared checkpoint_root, the sha1 of Spark's state root keeps two
    queries apart; operator/partition/name keep their stores apart.
    """
    if settings.checkpoint_root is None:
        return normalize_url(ref.location).rstrip("/")
    digest = hashlib.sha1(str(ref.spark_root).encode()).hexdigest()[:16]
    base = normalize_url(settings.checkpoint_root).rstrip("/")
    return f"{base}/{digest}/{ref.operator}/{ref.partition}/{ref.name}"


def _metadata_url(ref, settings: Settings) -> str | None:
    if not settings.memory_metadata_dir:
        return None
    digest = hashlib.sha1(str(ref.spark_root).encode()).hexdigest()[:16]
    base = normalize_url(settings.memory_metadata_dir).rstrip("/")
    return f"{base}/{digest}/{ref.operator}/{ref.partition}/{ref.name}"


def storage_for(ref, settings: Settings) -> CheckpointStorage:
    """The checkpoint storage settings.storage names, rooted where this store's files belong."""
    if settings.storage not in STORAGES:
        raise OptionError(f"{PREFIX}storage={settings.storage!r} is not known; use one of: {', '.join(STORAGES)}.")
    root = resolve_root(ref, settings)
    if settings.storage == "memory":
        return MemoryCheckpointStorage(root, settings.memory_max_state_size, _metadata_url(ref, settings))
    return FileSystemCheckpointStorage(root)
