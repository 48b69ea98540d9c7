"""Rescale: change a stopped query's partition count by writing metadata only.

Spark pins a stateful query's partition count in its offset log. Its own
offline repartition (``spark._streamingCheckpointManager.repartition``,
RocksDB only) appends batch ``N+1`` to ``offsets/`` as a copy of the last
committed batch ``N`` with the new ``spark.sql.shuffle.partitions``, rewrites
every row of state through a Spark job as version ``N+2``, updates the
operator metadata and writes ``commits/N+1``; the restarted query resumes
with batch ``N+2`` under the new count. This does the same steps but writes
no state: the manifest of version ``N+2`` of each new partition ``p'`` names
the old partitions' files as *slices* (manifest format 3), the rows of each
file that Spark routes to ``p'``:

- the old partitions that can hold such rows and their key groups come from
  ``keygroups.read_plan``;
- when the new count divides the max parallelism M, a slice reads whole key
  groups by byte range; otherwise it reads the candidate key groups and
  filters by the stored hash;
- when the new count divides the old one, every row of old partition ``p``
  goes to ``p mod N'``: the old files are named whole;
- a file that is already a slice (a second rescale before compaction) gets
  the conjunction of both conditions (``keygroups.combine_residues``).

Its cost is a few small files per store, whatever the state's size.
Compaction later folds a rescaled chain into the new partition's own
snapshot (spark_state.chain.compaction), and until every manifest that names
an old file is gone, a reference record in the old store keeps retention from
deleting it (spark_state.chain.references).

Crash safety: everything is read and checked before anything is written;
then ``offsets/N+1``, the reference records, the manifests, the operator
metadata and ``commits/N+1``, in that order. An interrupted rescale leaves
an uncommitted batch ``N+1``; Spark refuses to start on it and running the
same rescale again finishes it (another count is refused until then).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Mapping

from spark_state.chain import VersionedStore
from spark_state.chain.references import Reference, write_reference
from spark_state.errors import CheckpointError, SparkStateError
from spark_state.format.manifest import FileEntry, Manifest
from spark_state.keygroups import combine_residues, read_plan
from spark_state.lifecycle.health import listings, missing_file
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.savepoint import refuse_savepoint
from spark_state.options import PREFIX, Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint, require_filesystem_storage
from spark_state.spark.files import SHUFFLE_PARTITIONS, STATE_PARTITIONS, OperatorMetadata
from spark_state.storage.layout import StoreId


@dataclass(frozen=True)
class Rescaled:
    location: str
    batch: int             # the rescale batch N+1 (committed); the query resumes with N+2
    state_version: int     # N+2, written for every new partition
    old_partitions: int
    new_partitions: int
    manifests: int
    references: int
    bytes_written: int
    seconds: float


def slice_chain(sources: dict[int, Manifest], old_n: int, new_n: int, partition: int) -> tuple[FileEntry, ...]:
    """The chain of new partition `partition` of `new_n`: slices of the old partitions' chains."""
    some = next(iter(sources.values()))
    plan = read_plan(partition, new_n, old_n, some.max_parallelism)
    whole = old_n % new_n == 0
    out = []
    for src in plan.sources:
        for entry in sources[src.partition].files:
            holder = src.partition if entry.partition is None else entry.partition
            own = None if entry.modulus is None else (entry.modulus, entry.residue)
            cond = own if whole else combine_residues(own, (new_n, partition))
            if cond is False:
                continue
            sliced = replace(entry, partition=None if holder == partition else holder,
                             modulus=None if cond is None else cond[0], residue=None if cond is None else cond[1])
            # a row image holds every row of its file, in its own store: a slice restores by loading rows
            out.append(replace(sliced, image=None) if sliced.is_slice else sliced)
    return tuple(out)


def source_manifest(store: VersionedStore, version: int) -> Manifest:
    """Version `version` of an old partition as a rescale slices it: its compacted snapshot when a valid
    compaction record names one (one file to slice instead of a chain), else its manifest's chain."""
    view = store.reader.view(version)
    return view.manifest if view.record is None else replace(view.manifest, files=(view.record.snapshot,))


def plan_rescale(sources: Mapping[tuple[int, str], Mapping[int, Manifest]], old_n: int, new_n: int, version: int,
                 query_id: str | None, progress: Progress = Progress()
                 ) -> tuple[dict[StoreId, Manifest], dict[tuple[StoreId, int], set[str]]]:
    """Manifests of `version` for every new partition of every (operator, store name) in `sources` (their
    old partitions' manifests), and the reference records to write first: (holder store, referring
    partition) -> the holder's files that partition's manifest names."""
    plans: dict[StoreId, Manifest] = {}
    references: dict[tuple[StoreId, int], set[str]] = {}
    with progress.task(f"planning {len(sources) * new_n} stores", len(sources) * new_n) as task:
        for (op, name), by_partition in sources.items():
            if sorted(by_partition) != list(range(old_n)):
                raise CheckpointError(f"operator {op} store {name}: expected the manifests of partitions "
                                      f"0..{old_n - 1}, got {sorted(by_partition)}.")
            m = next(iter(by_partition.values())).max_parallelism
            for p in range(new_n):
                chain = slice_chain(by_partition, old_n, new_n, p)
                plans[StoreId(op, p, name)] = Manifest(version, m, chain, rows=None, query_id=query_id)
                for entry in chain:
                    if entry.partition is not None:
                        references.setdefault((StoreId(op, entry.partition, name), p), set()).add(entry.path)
                task.advance()
    return plans, references


def active_query_ids() -> set[str]:
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        return {q.id for q in spark.streams.active} if spark is not None else set()
    except Exception:  # noqa: BLE001 - no usable session: nothing to detect here
        return set()


def _check_stopped(ckpt: SparkCheckpoint, new_n: int) -> tuple[int, bool]:
    """(last committed batch N, whether batch N+1 is an unfinished rescale to new_n) or a clear refusal."""
    committed = ckpt.committed()
    if ckpt.query_id in active_query_ids():
        raise CheckpointError(f"query {ckpt.query_id} is running in this Spark session; stop it "
                              f"(query.stop()) before rescaling {ckpt.url}.")
    last = ckpt.last_batch
    resume = False
    if last is not None and last > committed:
        pending = ckpt.offsets(last)
        unfinished = (last == committed + 1 and pending.offsets == ckpt.offsets(committed).offsets
                      and ckpt.num_partitions(last) != ckpt.num_partitions(committed))
        if unfinished and ckpt.num_partitions(last) == new_n:
            resume = True
        elif unfinished:
            raise CheckpointError(
                f"batch {last} of {ckpt.url} is an unfinished rescale to {ckpt.num_partitions(last)} partitions; "
                f"run the rescale to {ckpt.num_partitions(last)} again to finish it, then rescale to {new_n}; or go "
                f"back to the state before it: spark-state restore {ckpt.url} NEW --batch {committed} (a new "
                f"checkpoint with {ckpt.num_partitions(committed)} partitions), then rescale NEW to {new_n}.")
        else:
            raise CheckpointError(
                f"batch {last} of {ckpt.url} started but did not commit (last committed: {committed}): the query "
                f"is running, or its last batch failed. Stop the query, or restart it and let it commit a batch, "
                f"then rescale.")
    return committed, resume


def rescale(checkpoint_location: str, num_partitions: int, *, options: Mapping[str, str] | Settings | None = None,
            progress: Progress = Progress()) -> Rescaled:
    """Rescales a stopped spark_state query to `num_partitions` (see the module docstring).

    `options` are the query's spark_state options (its ``checkpointRoot``, if
    it set one). Restart the query on the same checkpoint afterwards; it runs
    with the new count.
    """
    started = time.perf_counter()
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1:
        raise CheckpointError(f"the new partition count must be at least 1, got {num_partitions!r}.")
    settings = settings_from(options)
    require_filesystem_storage(settings, "a stopped query's state cannot be rescaled (it is gone with the worker)")
    ckpt = SparkCheckpoint(checkpoint_location, settings)
    refuse_savepoint(ckpt.dir, "rescale")
    committed, resume = _check_stopped(ckpt, num_partitions)
    ckpt.require_spark_state(committed)
    ckpt.require_format_v1(committed, "rescale")
    old_n = ckpt.num_partitions(committed)
    if old_n == num_partitions:
        raise CheckpointError(f"{ckpt.url} already runs with {old_n} partitions (batch {committed}); nothing to do.")
    batch, version = committed + 1, committed + 2

    # Read and check everything before writing anything.
    old_stores = ckpt.stores(committed)
    sources: dict[tuple[int, str], dict[int, Manifest]] = {}
    with progress.task("reading manifests", len(old_stores)) as task:
        for sid in old_stores:
            present = ckpt.versions(sid)
            newer = [v for v in present if v > committed + 1 and not (resume and v == version)]
            if newer:
                raise CheckpointError(
                    f"store ({sid}) has version {newer[0]}, newer than the last committed batch {committed} "
                    f"(version {committed + 1}): a batch is running or failed. Stop the query and let it commit "
                    f"a batch before rescaling.")
            if committed + 1 not in present:
                raise CheckpointError(
                    f"store ({sid}) has no version {committed + 1}, the state of batch {committed}; it holds "
                    f"{present or 'no version'}. If the query set {PREFIX}checkpointRoot, pass it (CLI: --conf); "
                    f"a query on memory storage cannot be rescaled.")
            sources.setdefault((sid.operator, sid.name), {})[sid.partition] = source_manifest(ckpt.store(sid),
                                                                                             committed + 1)
            task.advance()
    listing = listings()
    for (op, name), by_partition in sources.items():
        for p, manifest in sorted(by_partition.items()):
            sid = StoreId(op, p, name)
            why = missing_file(sid, ckpt.store_root(sid), ckpt.store_root, listing, manifest.files)
            if why is not None:
                raise CheckpointError(
                    f"the state of batch {committed} cannot load: {why}. A rescale would carry that into every "
                    f"new partition; `spark-state validate {ckpt.url}` names every damaged file and the batch to "
                    f"go back to (spark-state restore --batch N into a new location, then rescale that).")
    for (op, name), by_partition in sources.items():
        ms = {m.max_parallelism for m in by_partition.values()}
        if len(ms) != 1:
            raise CheckpointError(f"operator {op} store {name}: its partitions record different max parallelisms "
                                  f"{sorted(ms)}; the checkpoint is inconsistent.")
        if num_partitions > min(ms):
            raise CheckpointError(
                f"{num_partitions} partitions exceed maxParallelism {min(ms)}, the number of key groups this "
                f"checkpoint's state is divided into ({PREFIX}maxParallelism, fixed for the life of a checkpoint): "
                f"a partition would own no key group. Rescale to at most {min(ms)} partitions. Nothing was written.")
    plans, references = plan_rescale(sources, old_n, num_partitions, version, ckpt.query_id, progress)
    for sid in sorted(set(plans) - set(old_stores)):
        # A partition beyond the old count may hold versions of an earlier, larger count: only older ones.
        newer = [v for v in ckpt.versions(sid) if v > committed + 1 and not (resume and v == version)]
        if newer:
            raise CheckpointError(
                f"store ({sid}) has version {newer[0]}, newer than the last committed batch {committed}: it "
                f"belongs to another timeline of this checkpoint (a run from before a restore or a hand-made "
                f"copy?). Move {ckpt.store_root(sid)} away, then rescale again.")
    operator_metadata = {}
    for op in ckpt.operators:
        if op.metadata is not None:
            operator_metadata[op.id] = op.metadata

    # Write: offsets, references, manifests, operator metadata, commit.
    written = 0
    offsets = ckpt.offsets(committed)
    updates = {SHUFFLE_PARTITIONS: str(num_partitions)}
    if STATE_PARTITIONS in offsets.conf:
        updates[STATE_PARTITIONS] = str(num_partitions)
    data = offsets.with_conf(updates).to_bytes()
    ckpt.dir.write(f"offsets/{batch}", data)
    written += len(data)
    with progress.task(f"writing version {version} of {len(plans)} stores", len(references) + len(plans)) as task:
        for (holder, referrer), files in sorted(references.items()):
            ref = Reference(referrer, version, tuple(sorted(files)))
            write_reference(ckpt.store(holder).storage, ref)
            written += len(ref.to_json())
            task.advance()
        for sid, manifest in sorted(plans.items()):
            body = manifest.to_json()
            ckpt.store(sid).storage.commit_manifest(version, body)
            written += len(body)
            task.advance()
    for op, meta in operator_metadata.items():
        if meta.num_partitions != num_partitions:
            data = meta.with_partitions(num_partitions)
            ckpt.dir.write(f"state/{op}/_metadata/metadata", data)
            written += len(data)
    data = ckpt.dir.read(f"commits/{committed}")
    ckpt.dir.write(f"commits/{batch}", data)
    written += len(data)
    return Rescaled(ckpt.url, batch, version, old_n, num_partitions, len(plans), len(references), written,
                    time.perf_counter() - started)


__all__ = ["Rescaled", "rescale", "plan_rescale", "slice_chain", "OperatorMetadata", "SparkStateError"]
