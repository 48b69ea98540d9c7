"""validate: every file a checkpoint or savepoint names exists and matches its recorded checksum.

For a checkpoint: the query's metadata, every offset and commit log entry
(they must parse), and for every store every retained manifest (its own
checksum) and every data file the manifests name (size, then CRC-32 of the
whole file; a file several versions share is read once). For a savepoint:
its ``_metadata`` listing and every file in it. Problems are collected, not
raised, so one run names every bad file.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from spark_state import PROVIDER_CLASS
from spark_state.errors import SparkStateError
from spark_state.lifecycle.cut import Item
from spark_state.lifecycle.failures import explain
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.savepoint import is_savepoint, read_savepoint
from spark_state.options import Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.spark.files import OffsetSeq, parse_commit
from spark_state.storage.directory import Dir
from spark_state.storage.layout import StoreId, format_versions


@dataclass(frozen=True)
class Problem:
    file: str
    message: str


@dataclass
class Validation:
    location: str
    kind: str                 # "checkpoint" or "savepoint"
    files: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: the committed batches a problem affects (a restore to them fails), and the latest retained one that no
    #: problem affects: ``spark-state restore LOCATION NEW --batch way_back`` resumes the query after it
    affected_batches: list[int] = field(default_factory=list)
    way_back: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _check(item: Item, report: Validation) -> bool:
    name = item.source.url_of(item.source_rel) if item.source is not None else item.rel
    try:
        data = item.fetch()
    except SparkStateError as err:
        report.problems.append(Problem(name, str(err)))
        return False
    report.files += 1
    report.bytes += len(data)
    return True


def _validate_savepoint(sp: Dir, report: Validation, progress: Progress) -> None:
    try:
        meta = read_savepoint(sp)
    except SparkStateError as err:
        report.problems.append(Problem(sp.url_of("_metadata"), str(err)))
        return
    with progress.task("checking savepoint files", len(meta.files)) as task:
        for f in meta.files:
            _check(Item(f.path, sp, f.path, size=f.size, checksum=f.checksum), report)
            task.advance()


def _validate_logs(ckpt: SparkCheckpoint, report: Validation) -> set[int]:
    """Checks ``metadata`` and every offset and commit log entry; the batches whose entries are bad."""
    bad = set()
    for rel, batch, parse in [("metadata", None, None)] + \
            [(f"offsets/{b}", b, OffsetSeq.parse) for b in ckpt.offset_batches] + \
            [(f"commits/{b}", b, parse_commit) for b in ckpt.committed_batches]:
        url = ckpt.dir.url_of(rel)
        try:
            data = ckpt.dir.read(rel)
            if parse is None:
                _ = ckpt.query_id
            else:
                parse(data, url)
        except (FileNotFoundError, SparkStateError) as err:
            report.problems.append(Problem(url, f"{url} is missing." if isinstance(err, FileNotFoundError)
                                           else str(err)))
            bad.add(batch)
            continue
        report.files += 1
        report.bytes += len(data)
    return bad - {None}


def _stores(ckpt: SparkCheckpoint, batch: int | None) -> list[tuple[StoreId, list[int] | None]]:
    """(store, versions to check or None for all retained) for every partition count still in the logs."""
    batches = [batch] if batch is not None else [b for b in ckpt.offset_batches]
    counts = set()
    for b in batches:
        try:
            counts.add(ckpt.num_partitions(b))
        except SparkStateError:
            continue
    sids = sorted({StoreId(op.id, p, name) for op in ckpt.operators for name in op.stores
                   for n in counts for p in range(n)})
    return [(sid, [batch + 1] if batch is not None else None) for sid in sids]


def validate(location: str, *, batch: int | None = None, options: Mapping[str, str] | Settings | None = None,
             progress: Progress = Progress()) -> Validation:
    """Checks a checkpoint (every retained version, or only `batch`'s) or a savepoint; see the module docstring."""
    where = Dir(location)
    if is_savepoint(where):
        report = Validation(where.url, "savepoint")
        _validate_savepoint(where, report, progress)
        return report
    ckpt = SparkCheckpoint(where, settings_from(options))
    report = Validation(ckpt.url, "checkpoint")
    logs_bad = _validate_logs(ckpt, report)
    at = ckpt.committed(batch) if batch is not None else ckpt.last_committed
    required: dict[StoreId, int] = {}
    if at is not None:
        try:
            ckpt.provider(at)
        except SparkStateError:
            pass   # a damaged offset log entry: a problem found below
        else:
            ckpt.require_spark_state(at)   # another provider's state: validate cannot run (exit 2, not 1)
        try:
            required = {sid: at + 1 for sid in ckpt.stores(at)}
        except SparkStateError as err:
            url = ckpt.dir.url_of(f"offsets/{at}")
            if not any(p.file == url for p in report.problems):   # _validate_logs named it already
                report.problems.append(Problem(url, str(err)))
    seen: dict[tuple[str, str], bool] = {}   # (root, path) -> whether it checked fine
    bad: set[tuple[StoreId, int]] = set()      # store versions a problem affects
    stores = _stores(ckpt, batch)
    with progress.task("checking stores", len(stores)) as task:
        for sid, versions in stores:
            try:
                store = ckpt.store(sid)
                present = store.versions()
                wanted = versions if versions is not None else present
                root = Dir(store.storage.root)
                if not present:
                    root.files()   # no version: a directory it may not list raises here, and is named
                if sid in required and required[sid] not in present:
                    report.problems.append(Problem(
                        root.url_of(f"chk-{required[sid]}/_metadata"),
                        f"store ({sid}) has no version {required[sid]}, the state of batch {at}; versions present: "
                        f"{format_versions(present)}. {ckpt.where_hint()}"))
                    bad.add((sid, required[sid]))
                    wanted = [v for v in wanted if v in present]
                for v in wanted:
                    if not _check_version(ckpt, sid, v, root, seen, report):
                        bad.add((sid, v))
            except (SparkStateError, OSError) as err:
                report.problems.append(Problem(ckpt.store_root(sid), explain(err)))
                bad.update((sid, v) for v in (versions or [b + 1 for b in ckpt.committed_batches]))
            task.advance()
    if report.problems:
        _way_back(ckpt, bad, logs_bad, report)
    return report


def _check_version(ckpt: SparkCheckpoint, sid: StoreId, v: int, root: Dir, seen: dict, report: Validation) -> bool:
    """Checks version `v`'s manifest and every file it names (each file once per run); whether all were fine."""
    try:
        manifest = ckpt.manifest(sid, v)
    except SparkStateError as err:
        report.problems.append(Problem(root.url_of(f"chk-{v}/_metadata"), str(err)))
        return False
    report.files += 1
    fine = True
    for entry in manifest.files:
        # a rescaled chain names files in other partitions' stores (manifest format 3)
        holder = root if entry.partition is None else Dir(ckpt.store_root(replace(sid, partition=entry.partition)))
        files = [(entry.path, entry.size, entry.checksum)]
        if entry.image is not None:   # a snapshot's row image is checked like any state file
            files.append((entry.image.path, entry.image.size, entry.image.checksum))
        for path, size, checksum in files:
            if (holder.url, path) not in seen:
                seen[(holder.url, path)] = _check(Item(path, holder, path, size=size, checksum=checksum), report)
            fine = fine and seen[(holder.url, path)]
    return fine


def _way_back(ckpt: SparkCheckpoint, bad: set[tuple[StoreId, int]], logs_bad: set[int], report: Validation) -> None:
    """The committed batches the problems affect, and the latest one they do not: what restore can go back to."""
    versions_bad = {v for _, v in bad}
    report.affected_batches = sorted(b for b in ckpt.committed_batches if b + 1 in versions_bad or b in logs_bad)
    intact = [b for b in ckpt.committed_batches if b not in report.affected_batches and b in ckpt.offset_batches
              and _retained(ckpt, b)]
    report.way_back = intact[-1] if intact else None


def _retained(ckpt: SparkCheckpoint, batch: int) -> bool:
    """Whether every store still has version ``batch + 1`` (retention keeps the last minBatchesToRetain)."""
    try:
        if ckpt.provider(batch) != PROVIDER_CLASS:
            return False
        return all(batch + 1 in ckpt.versions(sid) for sid in ckpt.stores(batch))
    except SparkStateError:
        return False
