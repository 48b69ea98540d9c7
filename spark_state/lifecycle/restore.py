"""Restore (Flink's ``flink run -s``): a new checkpoint location that resumes exactly at a batch.

The source is a savepoint, or a checkpoint and one of its retained batches
(roll back). The target must be new or empty: a restore never overwrites a
checkpoint. Starting the same query on the target resumes after the batch:
Spark reads the offsets and commits up to it, and every store's version
``batch + 1`` is there.

**The restored checkpoint gets a new query id.** Spark resumes from the
offset and commit logs, not from the id (``metadata`` only names the query),
so nothing needs the old one; a new one makes the restored checkpoint a
timeline of its own, as a restored Flink savepoint is a new job: two queries
with one id in one session would stop each other
(``spark.sql.streaming.stopActiveRunOnRestart``), and spark_state keys its
stores by the checkpoint's identity.

Files are written in an order that makes an interrupted restore fail loudly
instead of resuming wrong: all offsets first, then state, source logs and
commits, and ``metadata`` last. Spark then finds either nothing (and starts
from batch 0, correctly) or offsets without the state or commits they need
(and stops with a missing-version error). Delete the target and run restore
again after an interruption.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Mapping

from spark_state.errors import CheckpointError
from spark_state.format.manifest import Manifest
from spark_state.lifecycle.cut import Item, NewCheckpoint, checkpoint_cut, copy_items, split_store_path
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.savepoint import is_savepoint, read_savepoint
from spark_state.options import Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint, store_root
from spark_state.spark.files import query_metadata
from spark_state.storage.directory import Dir
from spark_state.storage.layout import MANIFEST_NAME, version_dir_of


@dataclass(frozen=True)
class Restored(NewCheckpoint):
    files: int
    bytes: int


def _require_empty(target: Dir, what: str) -> None:
    occupied = target.occupied()
    if occupied:
        raise CheckpointError(
            f"refusing to restore into {target.url}: {what} is not new or empty ({occupied}). Restore writes "
            f"a new checkpoint and never overwrites one; give a new or empty location."
        )


def _with_query_id(item: Item, query_id: str) -> Item:
    found = split_store_path(item.rel)
    if found is None or not found[1].endswith(f"/{MANIFEST_NAME}") or version_dir_of(found[1].split("/")[0]) is None:
        return item
    manifest = Manifest.from_json(item.fetch(), item.rel)
    return replace(item, source=None, data=replace(manifest, query_id=query_id).to_json(), size=None, checksum=None)


def restore(source: str, checkpoint_location: str, batch: int | None = None, *,
            options: Mapping[str, str] | Settings | None = None, progress: Progress = Progress()) -> Restored:
    """Prepares `checkpoint_location` (new or empty) so the same query started on it resumes after `batch`.

    `source` is a savepoint directory or a checkpoint location. For a
    checkpoint, `batch` is any restorable batch (``spark-state ls`` lists
    them; default the latest committed); for a savepoint it may be omitted or
    must be the savepoint's batch. `options` are the spark_state options the
    restored query will run with (``checkpointRoot``: its state is written
    there) and, for a checkpoint source, the ones it ran with.
    """
    settings = settings_from(options)
    src = Dir(source)
    target = Dir(checkpoint_location)
    if src.url == target.url:
        raise CheckpointError(f"source and target are both {src.url}; restore into a new location.")
    _require_empty(target, "the target location")
    if is_savepoint(src):
        meta = read_savepoint(src)
        if batch is not None and batch != meta.batch:
            raise CheckpointError(f"savepoint {src.url} holds batch {meta.batch}, not {batch}; omit the batch or "
                                  f"pick the savepoint of batch {batch}.")
        items = [Item(f.path, src, f.path, size=f.size, checksum=f.checksum) for f in meta.files]
        at, source_query = meta.batch, meta.query_id
    else:
        ckpt = SparkCheckpoint(src, settings)
        cut = checkpoint_cut(ckpt, batch, progress)
        items, at, source_query = cut.items, cut.batch, cut.query_id
    query_id = str(uuid.uuid4())
    items = [replace(i, source=None, data=query_metadata(query_id), size=None, checksum=None)
             if i.rel == "metadata" else i for i in items]
    if not any(i.rel == "metadata" for i in items):
        items.append(Item("metadata", data=query_metadata(query_id)))
    # Every manifest names its timeline (docs/consistency.md, rule 1): the restored query commits on them.
    items = [_with_query_id(i, query_id) for i in items]

    roots: dict = {}
    if settings.checkpoint_root is not None:
        for item in items:
            found = split_store_path(item.rel)
            if found is not None and found[0] not in roots:
                roots[found[0]] = Dir(store_root(target, found[0], settings, query_id))
                _require_empty(roots[found[0]], f"the directory of store ({found[0]}) under checkpointRoot")

    def place(rel: str) -> tuple[Dir, str]:
        found = split_store_path(rel)
        if found is None or found[0] not in roots:
            return target, rel
        return roots[found[0]], found[1]

    copied = copy_items(items, place, progress, f"restoring batch {at}")
    return Restored(target.url, query_id, at, src.url, source_query, len(copied), sum(c.size for c in copied))
