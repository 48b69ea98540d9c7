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

from spark_state.errors import SparkStateError
from spark_state.lifecycle.cut import Item
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

    @property
    def ok(self) -> bool:
        return not self.problems


def _check(item: Item, report: Validation) -> None:
    name = item.source.url_of(item.source_rel) if item.source is not None else item.rel
    try:
        data = item.fetch()
    except SparkStateError as err:
        report.problems.append(Problem(name, str(err)))
        return
    report.files += 1
    report.bytes += len(data)


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


def _validate_logs(ckpt: SparkCheckpoint, report: Validation) -> None:
    for rel, parse in [("metadata", None)] + [(f"offsets/{b}", OffsetSeq.parse) for b in ckpt.offset_batches] + \
            [(f"commits/{b}", parse_commit) for b in ckpt.committed_batches]:
        url = ckpt.dir.url_of(rel)
        try:
            data = ckpt.dir.read(rel)
            if parse is None:
                _ = ckpt.query_id
            else:
                parse(data, url)
        except FileNotFoundError:
            report.problems.append(Problem(url, f"{url} is missing."))
            continue
        except SparkStateError as err:
            report.problems.append(Problem(url, str(err)))
            continue
        report.files += 1
        report.bytes += len(data)


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
    _validate_logs(ckpt, report)
    at = ckpt.committed(batch) if batch is not None else ckpt.last_committed
    required: dict[StoreId, int] = {}
    if at is not None:
        try:
            ckpt.require_spark_state(at)
            required = {sid: at + 1 for sid in ckpt.stores(at)}
        except SparkStateError as err:
            report.problems.append(Problem(ckpt.dir.url_of(f"offsets/{at}"), str(err)))
    seen: set[tuple[str, str]] = set()
    stores = _stores(ckpt, batch)
    with progress.task("checking stores", len(stores)) as task:
        for sid, versions in stores:
            try:
                store = ckpt.store(sid)
                present = store.versions()
                wanted = versions if versions is not None else present
                root = Dir(store.storage.root)
                if sid in required and required[sid] not in present:
                    report.problems.append(Problem(
                        root.url_of(f"chk-{required[sid]}/_metadata"),
                        f"store ({sid}) has no version {required[sid]}, the state of batch {at}; versions present: "
                        f"{format_versions(present)}. {ckpt.where_hint()}"))
                    wanted = [v for v in wanted if v in present]
                for v in wanted:
                    manifest_url = root.url_of(f"chk-{v}/_metadata")
                    try:
                        manifest = ckpt.manifest(sid, v)
                    except SparkStateError as err:
                        report.problems.append(Problem(manifest_url, str(err)))
                        continue
                    report.files += 1
                    for entry in manifest.files:
                        # a rescaled chain names files in other partitions' stores (manifest format 3)
                        holder = root if entry.partition is None else \
                            Dir(ckpt.store_root(replace(sid, partition=entry.partition)))
                        if (holder.url, entry.path) in seen:
                            continue
                        seen.add((holder.url, entry.path))
                        _check(Item(entry.path, holder, entry.path, size=entry.size, checksum=entry.checksum), report)
            except SparkStateError as err:
                report.problems.append(Problem(ckpt.store_root(sid), str(err)))
            task.advance()
    return report
