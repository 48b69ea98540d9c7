"""The files that make up one committed batch of a checkpoint (a *cut*), and a verified copy of them.

A savepoint and a restore both copy a cut; they differ only in where the files go.
The cut of batch ``b`` is:

- ``metadata`` (the query id),
- ``offsets/n`` and ``commits/n`` for every logged ``n <= b``,
- each source's log up to ``b``: for the file source the entries up to the
  ``logOffset`` that ``offsets/b`` records (its log counts its own batches),
  for any other source its whole log,
- Spark's own files under ``state/`` (operator metadata, state schemas),
- for every store, the manifest of version ``b + 1`` and every data file it names.

Hadoop ``.crc`` companions are left out: Spark reads a checkpoint file without
one, and a copied companion would turn stale as soon as a tool rewrites the file.
Every data file is checked against the size and CRC-32 its manifest records
while it is copied, so a cut never carries a corrupted file forward.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from spark_state.errors import ChecksumMismatch, StorageError
from spark_state.format.datafile import crc32_hex
from spark_state.format.manifest import Manifest
from spark_state.lifecycle.progress import Progress
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.spark.files import OperatorMetadata, batch_of
from spark_state.storage.directory import Dir
from spark_state.storage.layout import DEFAULT_STORE, STORE_ENTRIES, StoreId, manifest_path

#: Copy order of a restore (see restore.py): offsets first, metadata last.
GROUPS = ("offsets", "state", "sources", "commits", "metadata")
_COPY_THREADS = 8


@dataclass(frozen=True)
class Item:
    """One file of a cut: where it goes (``rel``, checkpoint layout) and where its bytes come from."""

    rel: str
    source: Dir | None = None
    source_rel: str = ""
    data: bytes | None = None
    size: int | None = None        # expected size, when a manifest or listing records it
    checksum: str | None = None    # expected "crc32:…"

    @property
    def group(self) -> str:
        head = self.rel.split("/", 1)[0]
        return head if head in GROUPS else "state"

    def fetch(self) -> bytes:
        """The file's bytes, checked against the recorded size and checksum."""
        if self.data is not None:
            data = self.data
            name = self.rel
        else:
            name = self.source.url_of(self.source_rel)
            try:
                data = self.source.read(self.source_rel)
            except FileNotFoundError:
                raise StorageError(f"{name} is missing; it is named by the checkpoint's manifests or listing but "
                                   f"something deleted it. Pick another batch (spark-state ls) or savepoint.") from None
        if self.size is not None and len(data) != self.size:
            raise ChecksumMismatch(f"{name} has {len(data)} bytes but {self.size} were recorded; it is truncated "
                                   f"or was overwritten. Nothing was copied from it.")
        if self.checksum is not None and crc32_hex(data) != self.checksum:
            raise ChecksumMismatch(f"{name} has checksum {crc32_hex(data)} but {self.checksum} was recorded; it "
                                   f"is corrupted. Nothing was copied from it.")
        return data


@dataclass(frozen=True)
class Copied:
    rel: str
    size: int
    checksum: str


@dataclass(frozen=True)
class NewCheckpoint:
    """A checkpoint written from a cut of another (restore, migrate): the query resumes on it with batch + 1."""

    location: str
    query_id: str            # the new checkpoint's query id
    batch: int               # the query resumes with batch + 1
    source: str
    source_query_id: str

    def __str__(self) -> str:
        return self.location


@dataclass
class Cut:
    """The files of one committed batch and what they hold."""

    batch: int
    query_id: str
    num_partitions: int
    items: list[Item]
    manifests: dict[StoreId, Manifest] = field(default_factory=dict)

    @property
    def max_parallelism(self) -> int | None:
        values = {m.max_parallelism for m in self.manifests.values()}
        return values.pop() if len(values) == 1 else None


def split_store_path(rel: str) -> tuple[StoreId, str] | None:
    """(store, path inside the store) for a spark_state file in the default layout, else None."""
    parts = rel.split("/")
    if len(parts) < 5 or parts[0] != "state" or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    op, part = int(parts[1]), int(parts[2])
    if parts[3].startswith(STORE_ENTRIES):
        return StoreId(op, part, DEFAULT_STORE), "/".join(parts[3:])
    if len(parts) >= 6 and parts[4].startswith(STORE_ENTRIES):
        return StoreId(op, part, parts[3]), "/".join(parts[4:])
    return None


def _is_companion(name: str) -> bool:
    return name.endswith(".crc") or name.endswith(".tmp")


def log_items(ckpt: SparkCheckpoint, log: str, upto: int) -> list[Item]:
    out = []
    for name in ckpt.dir.listdir(log):
        b = batch_of(name)
        if b is not None and b <= upto:
            out.append(Item(f"{log}/{name}", ckpt.dir, f"{log}/{name}"))
    return out


def source_items(ckpt: SparkCheckpoint, batch: int) -> list[Item]:
    offsets = ckpt.offsets(batch)
    out = []
    for name in ckpt.dir.listdir("sources"):
        rel = f"sources/{name}"
        offset = offsets.source_offset(int(name)) if name.isdigit() else None
        upto = offset.get("logOffset") if offset else None
        for path in ckpt.dir.files(rel):
            file = posixpath.basename(path)
            if _is_companion(file):
                continue
            b = batch_of(file)
            if isinstance(upto, int) and b is not None and b > upto:
                continue
            out.append(Item(path, ckpt.dir, path))
    return out


def _spark_state_files(ckpt: SparkCheckpoint, batch: int, num_partitions: int) -> list[Item]:
    """Spark's own files under state/ (not spark_state's), operator metadata set to the batch's partition count."""
    out = []
    for path in ckpt.dir.files("state"):
        if _is_companion(posixpath.basename(path)) or split_store_path(path) is not None:
            continue
        parts = path.split("/")
        if len(parts) == 4 and parts[2:] == ["_metadata", "metadata"]:
            meta = OperatorMetadata.parse(ckpt.dir.read(path), ckpt.dir.url_of(path))
            if meta.num_partitions is not None and meta.num_partitions != num_partitions:
                out.append(Item(path, data=meta.with_partitions(num_partitions)))
                continue
        out.append(Item(path, ckpt.dir, path))
    return out


def store_items(ckpt: SparkCheckpoint, sid: StoreId, version: int) -> tuple[Manifest, list[Item]]:
    """The manifest of `version` of one store and the data files it names, checked on fetch."""
    store = ckpt.store(sid)
    manifest = ckpt.manifest(sid, version)
    root = Dir(store.storage.root)
    items = []
    for entry in manifest.files:
        # A rescaled chain names files in other partitions' stores: the copy holds them itself.
        source = root if entry.partition is None else Dir(ckpt.store_root(replace(sid, partition=entry.partition)))
        items.append(Item(f"{sid.rel}/{entry.path}", source, entry.path, size=entry.size, checksum=entry.checksum))
        if entry.image is not None:   # the snapshot's row image: a restore of the copy starts lazily too
            image = entry.image
            items.append(Item(f"{sid.rel}/{image.path}", source, image.path, size=image.size, checksum=image.checksum))
    if any(entry.partition is not None for entry in manifest.files):
        manifest = replace(manifest, files=tuple(replace(e, partition=None) for e in manifest.files))
    items.insert(0, Item(f"{sid.rel}/{manifest_path(version)}", data=manifest.to_json()))
    return manifest, items


def checkpoint_cut(ckpt: SparkCheckpoint, batch: int | None = None, progress: Progress = Progress()) -> Cut:
    """The cut of committed `batch` (default: the latest) of a spark_state checkpoint."""
    batch = ckpt.committed(batch)
    ckpt.require_spark_state(batch)
    ckpt.require_format_v1(batch, "a savepoint or restore")
    n = ckpt.num_partitions(batch)
    items = [Item("metadata", ckpt.dir, "metadata")]
    items += log_items(ckpt, "offsets", batch)
    items += log_items(ckpt, "commits", batch)
    items += source_items(ckpt, batch)
    items += _spark_state_files(ckpt, batch, n)
    cut = Cut(batch, ckpt.query_id, n, items)
    stores = ckpt.stores(batch)
    with progress.task(f"reading manifests of batch {batch}", len(stores)) as task:
        for sid in stores:
            manifest, store_files = store_items(ckpt, sid, batch + 1)
            cut.manifests[sid] = manifest
            cut.items += store_files
            task.advance()
    return cut


def copy_items(items: Iterable[Item], place: Callable[[str], tuple[Dir, str]], progress: Progress = Progress(),
               description: str = "copying files") -> list[Copied]:
    """Copies every item to ``place(item.rel)``, verifying what it reads; returns what was written.

    Items are copied group by group in ``GROUPS`` order (files of one group in
    parallel), so a copy that stops part-way never leaves later groups without
    earlier ones: see restore.py for why that order matters.
    """
    items = list(items)
    done: list[Copied] = []

    def one(item: Item) -> Copied:
        data = item.fetch()
        target, rel = place(item.rel)
        target.copy_in(rel, data)
        return Copied(item.rel, len(data), crc32_hex(data))

    with progress.task(description, len(items)) as task, ThreadPoolExecutor(_COPY_THREADS) as pool:
        for group in GROUPS:
            batch = [i for i in items if i.group == group]
            for copied in pool.map(one, batch):
                done.append(copied)
                task.advance()
    return done
