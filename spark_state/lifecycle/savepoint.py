"""Savepoints (Flink's ``savepoint-<id>-<random>/``): one committed batch of a query, self-contained.

A savepoint directory holds the checkpoint files of the batch in Spark's own
layout (``metadata``, ``offsets/``, ``commits/``, ``sources/``, ``state/``,
every store's state in ``state/<op>/<partition>[/<storeName>]`` whatever
``checkpointRoot`` the query used) and a ``_metadata`` file that lists every
one of them with its size and CRC-32. ``_metadata`` is written last and
``_in_progress`` first (removed at the end): a directory with the marker and
without ``_metadata`` is a savepoint that did not finish (its process died),
and restore refuses it. A savepoint that fails with an error removes itself.
Nothing in a savepoint points outside it, so it survives deleting the
checkpoint it was taken from.

Restore it with ``spark_state.restore(savepoint, new_location)``; do not run
a query on the savepoint directory itself, that would change it.
"""

from __future__ import annotations

import json
import secrets
import time
import zlib
from dataclasses import dataclass
from typing import Mapping

import spark_state
from spark_state.errors import CheckpointError, ChecksumMismatch, FormatVersionError
from spark_state.lifecycle.cut import Copied, checkpoint_cut, copy_items
from spark_state.lifecycle.progress import Progress
from spark_state.options import PREFIX, Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.storage.directory import Dir
from spark_state.storage.layout import StoreId
from spark_state.storage.urls import as_url

METADATA = "_metadata"
IN_PROGRESS = "_in_progress"
KIND = "spark_state savepoint"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SavepointFile:
    path: str
    size: int
    checksum: str


@dataclass(frozen=True)
class SavepointMetadata:
    """What ``_metadata`` of a savepoint records."""

    query_id: str
    batch: int
    num_partitions: int
    max_parallelism: int | None
    source: str
    created_ms: int
    stores: tuple[dict, ...]
    files: tuple[SavepointFile, ...]
    spark_state_version: str = spark_state.__version__
    format: int = FORMAT_VERSION

    @property
    def state_version(self) -> int:
        return self.batch + 1

    def to_json(self) -> bytes:
        body = {
            "kind": KIND, "format": self.format, "spark_state_version": self.spark_state_version,
            "query_id": self.query_id, "batch": self.batch, "state_version": self.state_version,
            "num_partitions": self.num_partitions, "max_parallelism": self.max_parallelism,
            "source": self.source, "created_ms": self.created_ms, "stores": list(self.stores),
            "files": [{"path": f.path, "size": f.size, "checksum": f.checksum} for f in self.files],
        }
        body["checksum"] = _crc(body)
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, name: str) -> "SavepointMetadata":
        try:
            body = json.loads(data)
            kind, fmt = body["kind"], body["format"]
        except (ValueError, TypeError, KeyError, RecursionError):
            raise ChecksumMismatch(f"{name} is not a savepoint's _metadata (not JSON or no kind/format); it is "
                                   f"corrupted or truncated.") from None
        if kind != KIND:
            raise CheckpointError(f"{name} is not a spark_state savepoint's _metadata (kind {kind!r}).")
        if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
            raise FormatVersionError(f"savepoint {name} has format {fmt}, newer than the {FORMAT_VERSION} this "
                                     f"spark_state reads; upgrade spark_state.")
        recorded = body.pop("checksum", None)
        if recorded != _crc(body):
            raise ChecksumMismatch(f"{name} does not match its own checksum; the savepoint's listing is corrupted "
                                   f"or was edited.")
        try:
            return cls(query_id=body["query_id"], batch=int(body["batch"]),
                       num_partitions=int(body["num_partitions"]), max_parallelism=body.get("max_parallelism"),
                       source=body["source"], created_ms=int(body["created_ms"]), stores=tuple(body["stores"]),
                       files=tuple(SavepointFile(**f) for f in body["files"]),
                       spark_state_version=body.get("spark_state_version", "?"), format=fmt)
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise ChecksumMismatch(f"{name} has unexpected fields ({err!r}); the savepoint's listing was not "
                                   f"written by spark_state.") from None


def _crc(body: dict) -> str:
    return f"crc32:{zlib.crc32(json.dumps(body, sort_keys=True, separators=(',', ':')).encode()):08x}"


def is_savepoint(location: Dir) -> bool:
    """True when `location` is a savepoint, finished or not (read_savepoint tells which)."""
    if location.exists(IN_PROGRESS):
        return True
    try:
        return json.loads(location.read(METADATA)).get("kind") == KIND
    except (FileNotFoundError, NotADirectoryError, ValueError, AttributeError, IsADirectoryError, RecursionError):
        return False


def refuse_savepoint(location: Dir, command: str) -> None:
    """A clear refusal when `command` would write into savepoint `location`: a savepoint stays as it was written
    (its _metadata records every file's size and checksum); the command runs on a restored copy NEW."""
    if is_savepoint(location):
        raise CheckpointError(f"{location.url} is a savepoint, which stays as it was written: restore it first "
                              f"(spark-state restore {location.url} NEW) and {command} NEW. Nothing was written.")


def read_savepoint(location: str | Dir) -> SavepointMetadata:
    """The listing of a finished savepoint; a clear error for an unfinished one or another directory."""
    sp = location if isinstance(location, Dir) else Dir(location)
    try:
        data = sp.read(METADATA)
    except FileNotFoundError:
        if sp.exists("offsets") and not sp.exists(IN_PROGRESS):
            raise CheckpointError(f"{sp.url} is a checkpoint, not a savepoint.") from None
        raise CheckpointError(f"{sp.url} has no {METADATA}: it is not a savepoint, or a savepoint that did not "
                              f"finish (its {METADATA} is written last). Take the savepoint again.") from None
    return SavepointMetadata.from_json(data, sp.url_of(METADATA))


def _default_target(settings: Settings) -> str:
    """The directory savepoints go to when none is given: the savepointDir option, from `settings` or the active
    SparkSession's conf (the CLI has none); a clear error, before anything is read, when neither sets it."""
    if settings.savepoint_dir:
        return settings.savepoint_dir
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
    except ImportError:
        active = None
    if active is not None:
        value = active.conf.get(PREFIX + "savepointDir", None)
        if value:
            return value
    raise CheckpointError(
        f"no target directory for the savepoint (each savepoint is a new directory in it): pass one (--target DIR; "
        f"target_directory= in Python) or set the savepointDir option (--conf {PREFIX}savepointDir=DIR; "
        f"configure(savepoint_dir=...))."
    )


def _refuse_target_in_checkpoint(target: Dir, checkpoint: Dir) -> None:
    """A savepoint must outlive its checkpoint: inside it, the savepoint would go when the checkpoint is deleted
    to start the query over, and Spark owns every directory there."""
    if target.url == checkpoint.url or target.url.startswith(checkpoint.url + "/"):
        raise CheckpointError(f"the savepoint target {target.url} is inside the query's checkpoint {checkpoint.url}, "
                              f"which a savepoint must outlive (deleting the checkpoint to start over would delete "
                              f"it too): give a directory outside the checkpoint, e.g. a sibling "
                              f"{checkpoint.url}-savepoints. Nothing was written.")


def savepoint(checkpoint_location: str, target_directory: str | None = None, *, batch: int | None = None,
              options: Mapping[str, str] | Settings | None = None, progress: Progress = Progress()) -> str:
    """Takes a savepoint of a committed batch (default: the latest) and returns its URL.

    The savepoint is ``<target>/savepoint-<first 6 of the query id>-<random>/``;
    `target_directory` defaults to the ``savepointDir`` option (in `options`
    or the active SparkSession's conf). `options` are the query's spark_state
    options (``checkpointRoot`` if it set one). The query may keep running:
    only committed, retained files are read, and each is verified as copied.
    """
    settings = settings_from(options)
    target = Dir(as_url(target_directory or _default_target(settings)))
    ckpt = SparkCheckpoint(checkpoint_location, settings)
    _refuse_target_in_checkpoint(target, ckpt.dir)
    cut = checkpoint_cut(ckpt, batch, progress)
    if is_savepoint(target):
        raise CheckpointError(f"{target.url} is a savepoint, which stays as it was written: give a target "
                              f"directory outside it (each savepoint is a new directory in the target).")
    if target.exists() and target.fs.isfile(target.full()):
        raise CheckpointError(f"the savepoint target {target.url} is a file; give a directory (new or not: each "
                              f"savepoint is a new directory in it).")
    name = f"savepoint-{cut.query_id.replace('-', '')[:6]}-{secrets.token_hex(6)}"
    sp = target.child(name)
    sp.copy_in(IN_PROGRESS, b"")
    try:
        copied = copy_items(cut.items, lambda rel: (sp, rel), progress, f"savepoint of batch {cut.batch}")
    except BaseException:
        sp.fs.rm(sp.full(), recursive=True)
        raise
    stores = tuple({"operator": sid.operator, "partition": sid.partition, "name": sid.name,
                    "version": m.version, "rows": m.rows} for sid, m in sorted(cut.manifests.items()))
    meta = SavepointMetadata(cut.query_id, cut.batch, cut.num_partitions, cut.max_parallelism, ckpt.url,
                             int(time.time() * 1000), stores, tuple(_files(copied)))
    sp.copy_in(METADATA, meta.to_json())
    sp.delete(IN_PROGRESS)
    return sp.url


def _files(copied: list[Copied]) -> list[SavepointFile]:
    return sorted((SavepointFile(c.rel, c.size, c.checksum) for c in copied), key=lambda f: f.path)


__all__ = ["SavepointMetadata", "StoreId", "read_savepoint", "savepoint", "is_savepoint", "refuse_savepoint"]
