"""A Spark checkpoint directory as the lifecycle tools see it: the query, its batches, its
stateful operators and the spark_state stores that hold their state.

Batch ``b`` of a query reads state version ``b`` and commits version ``b + 1``,
so the state *at* committed batch ``b`` is version ``b + 1`` of every store.
A batch is restorable when Spark committed it (``commits/b``), its offsets
are still logged (``offsets/b``) and every store still has version ``b + 1``
(retention keeps ``spark.sql.streaming.minBatchesToRetain`` of them).

Stores live where the worker put them (docs/format.md, "Checkpoint layout"): in
Spark's state directory of each store unless the query set ``checkpointRoot``;
then pass the same option in ``settings`` so the tools look where the worker
wrote. The tools open a store with the worker's own factory
(``spark_state.chain.registry``), so both read one store the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Mapping

from spark_state import PROVIDER_CLASS
from spark_state.chain import VersionedStore, open_store
from spark_state.errors import CheckpointError, SparkStateError, VersionNotFound
from spark_state.format.manifest import Manifest
from spark_state.options import PREFIX, Settings, settings_from
from spark_state.spark.files import (
    PROVIDER_CLASS_CONF, SHUFFLE_PARTITIONS, STATE_PARTITIONS, OffsetSeq, OperatorMetadata, batch_of, parse_commit,
    parse_query_id,
)
from spark_state.storage.directory import Dir
from spark_state.storage.layout import DEFAULT_STORE, STORE_ENTRIES, StoreId, StoreRef, format_versions, resolve_root

#: Spark's checkpoint format (2: state store checkpoint ids, recorded in the commit log as ``stateUniqueIds``).
CHECKPOINT_FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
#: The order of a stream-stream join's four stores in ``stateUniqueIds`` (Spark's SymmetricHashJoinStateManager).
JOIN_STORE_ORDER = ("left-keyToNumValues", "left-keyWithIndexToValue",
                    "right-keyToNumValues", "right-keyWithIndexToValue")


def require_filesystem_storage(settings: Settings, consequence: str) -> None:
    """Refuses an operation on a query's state from outside its workers when its storage keeps none on disk."""
    if settings.storage != "filesystem":
        raise CheckpointError(
            f"{PREFIX}storage={settings.storage}: memory storage keeps state in the worker process, so "
            f"{consequence}. Use storage=filesystem (the default) for state you want to operate on.")


@dataclass(frozen=True)
class Operator:
    """A stateful operator of the query: from Spark's operator metadata where it wrote one, else (name
    "unknown") from the store directories on disk."""

    id: int
    name: str
    stores: tuple[str, ...]
    metadata: OperatorMetadata | None


def partition_count(conf: Mapping[str, str]) -> int | None:
    """The state partition count an offset log entry's conf pins (Spark's internal conf where set, else the
    shuffle partitions), or None when it records none."""
    try:
        return int(conf.get(STATE_PARTITIONS, conf.get(SHUFFLE_PARTITIONS)))
    except (TypeError, ValueError):
        return None


def spark_state_root(checkpoint: Dir) -> str:
    """The state root string Spark hands the provider (``StateStoreId.checkpointRootLocation``):
    Hadoop's qualified path of ``<checkpoint>/state``, ``file:/abs/path/state`` for a local directory."""
    if checkpoint.local:
        return "file:" + checkpoint.full("state")
    return checkpoint.url_of("state")


def store_ref(checkpoint: Dir, sid: StoreId, query_id: str | None = None) -> StoreRef:
    """The StoreRef the worker gets for `sid` of the query (`query_id`) whose checkpointLocation is `checkpoint`."""
    return StoreRef.of(spark_state_root(checkpoint), sid, query_id)


def store_root(checkpoint: Dir, sid: StoreId, settings: Settings, query_id: str | None = None) -> str:
    """URL of the directory that holds the store's manifests and files (see resolve_root): under
    ``checkpointRoot`` it depends on the query id, as the worker's does."""
    return resolve_root(store_ref(checkpoint, sid, query_id), settings)


class SparkCheckpoint:
    """Reads one checkpoint directory (``checkpointLocation``); nothing here writes."""

    def __init__(self, location: str | Dir, options: Mapping[str, str] | Settings | None = None):
        self.dir = location if isinstance(location, Dir) else Dir(location)
        self.settings = settings_from(options)
        if not self.dir.exists("metadata") and not self.dir.exists("offsets"):
            raise CheckpointError(f"{self.dir.url} {self._what_instead()}. Pass the checkpointLocation of a "
                                  f"streaming query that has run at least once.")

    def _what_instead(self) -> str:
        if not self.dir.exists():
            return "does not exist"
        if self.dir.fs.isfile(self.dir.full()):
            return "is a file, not a checkpoint directory"
        return "is not a Spark checkpoint: it has neither 'metadata' nor 'offsets/'"

    def __repr__(self) -> str:
        return f"SparkCheckpoint({self.dir.url!r})"

    @property
    def url(self) -> str:
        return self.dir.url

    # ------------------------------------------------------------- Spark's logs

    @cached_property
    def query_id(self) -> str:
        try:
            return parse_query_id(self.dir.read("metadata"), self.dir.url_of("metadata"))
        except FileNotFoundError:
            raise CheckpointError(f"{self.dir.url_of('metadata')} is missing; the checkpoint has no query id. "
                                  f"It is incomplete (a restore that did not finish?).") from None

    def _log_batches(self, log: str) -> list[int]:
        return sorted({b for name in self.dir.listdir(log) if (b := batch_of(name)) is not None
                       and not name.endswith(".compact")})

    @cached_property
    def offset_batches(self) -> list[int]:
        return self._log_batches("offsets")

    @cached_property
    def committed_batches(self) -> list[int]:
        return self._log_batches("commits")

    @property
    def last_batch(self) -> int | None:
        return self.offset_batches[-1] if self.offset_batches else None

    @property
    def last_committed(self) -> int | None:
        return self.committed_batches[-1] if self.committed_batches else None

    def offsets(self, batch: int) -> OffsetSeq:
        rel = f"offsets/{batch}"
        try:
            return OffsetSeq.parse(self.dir.read(rel), self.dir.url_of(rel))
        except FileNotFoundError:
            raise CheckpointError(f"{self.dir.url_of(rel)} is missing: batch {batch} is not in the offset log "
                                  f"(batches logged: {format_versions(self.offset_batches)}).") from None

    def commit(self, batch: int) -> dict:
        rel = f"commits/{batch}"
        try:
            return parse_commit(self.dir.read(rel), self.dir.url_of(rel))
        except FileNotFoundError:
            raise CheckpointError(f"batch {batch} of {self.dir.url} was not committed (no {rel}); committed "
                                  f"batches: {format_versions(self.committed_batches)}.") from None

    def checkpoint_id(self, batch: int, sid: StoreId) -> str | None:
        """The checkpoint id Spark's commit log names for store `sid` after `batch` (checkpoint format v2: the
        commit id of the store's version ``batch + 1`` that Spark committed), else None (format v1)."""
        ids = self.commit(batch).get("stateUniqueIds") or {}
        per_partition = ids.get(str(sid.operator))
        if not per_partition:
            return None
        try:
            per_store = per_partition[sid.partition]
            index = JOIN_STORE_ORDER.index(sid.name) if len(per_store) == len(JOIN_STORE_ORDER) else 0
            return str(per_store[index])
        except (IndexError, ValueError, TypeError):
            raise CheckpointError(f"commits/{batch} of {self.dir.url} names no checkpoint id for store ({sid}): "
                                  f"its stateUniqueIds are {per_partition!r}; the commit log is damaged.") from None

    def load_state(self, sid: StoreId, batch: int):
        """The state of store `sid` after committed `batch`: version ``batch + 1``, the very commit Spark's commit
        log names under checkpoint format v2 (``checkpoint_id``), else the version's latest commit."""
        return self.store(sid).load_checked(batch + 1, lineage=self.checkpoint_id(batch, sid)).table

    def require_format_v1(self, batch: int, what: str) -> None:
        """Refuses a checkpoint that runs with checkpoint format v2 for a tool that writes Spark's logs."""
        if self.commit(batch).get("stateUniqueIds") or self.offsets(batch).conf.get(CHECKPOINT_FORMAT_CONF, "1") != "1":
            raise CheckpointError(
                f"{self.dir.url} runs with Spark's checkpoint format v2 ({CHECKPOINT_FORMAT_CONF}=2: state store "
                f"checkpoint ids, which Spark 4.3's real-time mode sets by default); {what} writes Spark's commit "
                f"log and handles format v1 checkpoints only. Nothing was written. Read the state with read_state "
                f"or export, or run the query with {CHECKPOINT_FORMAT_CONF}=1 from a new checkpoint.")

    def num_partitions(self, batch: int) -> int:
        """The state partition count Spark pinned for `batch` (the internal conf where set, else shuffle partitions)."""
        count = partition_count(self.offsets(batch).conf)
        if count is None:
            raise CheckpointError(f"offsets/{batch} of {self.dir.url} records no partition count; it was written "
                                  f"by a Spark older than 2.1, or edited.")
        return count

    def provider(self, batch: int) -> str | None:
        return self.offsets(batch).conf.get(PROVIDER_CLASS_CONF)

    def require_spark_state(self, batch: int) -> None:
        provider = self.provider(batch)
        if provider != PROVIDER_CLASS:
            raise CheckpointError(
                f"{self.dir.url} is not a spark_state checkpoint: its offset log pins the state store provider "
                f"{provider or 'of Spark (HDFSBackedStateStoreProvider)'}, not {PROVIDER_CLASS}. spark_state's "
                f"tools work on queries that ran with spark_state.configure(...); `spark-state migrate "
                f"{self.dir.url} NEW --to spark_state` writes a new checkpoint NEW that the query resumes from "
                f"on spark_state."
            )

    def committed(self, batch: int | None = None) -> int:
        """`batch` if it was committed, else the latest committed batch; CheckpointError when there is none."""
        if batch is None:
            if self.last_committed is None:
                raise CheckpointError(f"{self.dir.url} has no committed batch; run the query until it completes "
                                      f"a batch first.")
            return self.last_committed
        if batch < 0:
            raise CheckpointError(f"batch {batch} is negative; batches start at 0.")
        if batch not in self.committed_batches:
            raise CheckpointError(f"batch {batch} of {self.dir.url} is not committed; committed batches still "
                                  f"logged: {format_versions(self.committed_batches)}.")
        return batch

    # ------------------------------------------------------------- operators and stores

    @cached_property
    def operators(self) -> list[Operator]:
        out = []
        for name in self.dir.listdir("state"):
            if not name.isdigit():
                continue
            op = int(name)
            meta = None
            rel = f"state/{op}/_metadata/metadata"
            try:
                meta = OperatorMetadata.parse(self.dir.read(rel), self.dir.url_of(rel))
            except FileNotFoundError:
                pass
            if meta is not None:
                out.append(Operator(op, meta.name, meta.stores, meta))
            else:
                out.append(Operator(op, "unknown", self._store_names_on_disk(op), None))
        return sorted(out, key=lambda o: o.id)

    def _store_names_on_disk(self, op: int) -> tuple[str, ...]:
        names: set[str] = set()
        for part in self.dir.listdir(f"state/{op}"):
            if not part.isdigit():
                continue
            # the default store's entries and each named store are directories; files beside them (another
            # provider's 1.delta) are no store
            entries = self.dir.subdirs(f"state/{op}/{part}")
            if any(e.startswith(STORE_ENTRIES) for e in entries):
                names.add(DEFAULT_STORE)
            names.update(e for e in entries if not e.startswith(STORE_ENTRIES) and not e.startswith(("_", ".")))
        return tuple(sorted(names)) or (DEFAULT_STORE,)

    def stores(self, batch: int) -> list[StoreId]:
        """Every store of every operator for the partition count of `batch`."""
        n = self.num_partitions(batch)
        return [StoreId(op.id, p, name) for op in self.operators for name in op.stores for p in range(n)]

    def store_ref(self, sid: StoreId) -> StoreRef:
        return store_ref(self.dir, sid, self._store_query_id)

    def store_root(self, sid: StoreId) -> str:
        return resolve_root(self.store_ref(sid), self.settings)

    @cached_property
    def _store_query_id(self) -> str | None:
        """The query id the worker keys stores with (it matters under checkpointRoot only)."""
        if self.settings.checkpoint_root is None:
            return None
        return self.query_id

    def store(self, sid: StoreId) -> VersionedStore:
        """The store as the worker opens it (not cached: the tools' view is always fresh), with the max
        parallelism its manifests record.

        Memory storage cannot be read from another process: a clear error says so.
        """
        require_filesystem_storage(self.settings, "it cannot be read, copied or rescaled from outside")
        store = open_store(self.store_ref(sid), self.settings, cached=False)
        # The tools are not given the query's maxParallelism: its manifests say it (the newest that reads: a
        # damaged one is reported by whatever reads that version).
        for version in reversed(store.versions()):
            try:
                recorded = store.reader.read_manifest(version).max_parallelism
            except SparkStateError:
                continue
            store.update_settings(replace(self.settings, max_parallelism=recorded))
            break
        return store

    def manifest(self, sid: StoreId, version: int) -> Manifest:
        try:
            return self.store(sid).reader.read_manifest(version)
        except VersionNotFound as err:
            raise VersionNotFound(f"{err} {self.where_hint()}") from None

    def where_hint(self) -> str:
        """Where the tools looked for stores, and how to point them elsewhere."""
        if self.settings.checkpoint_root is None:
            return (f"If the query set {PREFIX}checkpointRoot, pass the same value (CLI: --conf "
                    f"{PREFIX}checkpointRoot=...).")
        return f"(looked under {PREFIX}checkpointRoot={self.settings.checkpoint_root})"

    def versions(self, sid: StoreId) -> list[int]:
        return self.store(sid).versions()
