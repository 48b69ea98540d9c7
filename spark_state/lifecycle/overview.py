"""What ``spark-state ls`` and ``spark-state inspect`` report, as plain dicts (the CLI renders them
or prints them as JSON)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from spark_state import PROVIDER_CLASS
from spark_state.errors import CheckpointError, SparkStateError
from spark_state.keygroups import divides, owned_key_groups
from spark_state.lifecycle.failures import explain
from spark_state.lifecycle.health import StoreHealth, listings, store_health
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.savepoint import is_savepoint, read_savepoint
from spark_state.options import Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint, partition_count
from spark_state.spark.files import PROVIDER_CLASS_CONF
from spark_state.storage.directory import Dir
from spark_state.storage.layout import DEFAULT_STORE, StoreId, format_versions

HISTOGRAM_BUCKETS = 20


def overview(location: str, *, options: Mapping[str, str] | Settings | None = None,
             progress: Progress = Progress()) -> dict:
    """A checkpoint's query, batches, operators and stores (versions, files, bytes); or a savepoint's listing.

    What cannot be read is listed under ``problems`` (file, why) and the rest is shown: a batch is
    ``restorable`` when every store's version of it loads as far as its manifest and the listing tell
    (``health``), ``damaged`` (with the first reason) when one does not.
    """
    where = Dir(location)
    if is_savepoint(where):
        meta = read_savepoint(where)
        return {"kind": "savepoint", "location": where.url, "query_id": meta.query_id, "batch": meta.batch,
                "num_partitions": meta.num_partitions, "max_parallelism": meta.max_parallelism,
                "source": meta.source, "created_ms": meta.created_ms, "stores": list(meta.stores),
                "files": len(meta.files), "bytes": sum(f.size for f in meta.files)}
    ckpt = SparkCheckpoint(where, settings_from(options))
    problems: list[dict] = []

    def attempt(rel: str, read, default=None):
        try:
            return read()
        except (SparkStateError, OSError) as err:
            problems.append({"file": ckpt.dir.url_of(rel), "message": explain(err)})
            return default

    query_id = attempt("metadata", lambda: ckpt.query_id)
    confs = {b: c for b in ckpt.offset_batches
             if (c := attempt(f"offsets/{b}", lambda b=b: ckpt.offsets(b).conf)) is not None}
    last = max(confs) if confs else None
    provider = confs[last].get(PROVIDER_CLASS_CONF) if last is not None else None
    partitions = {b: n for b, c in confs.items() if (n := partition_count(c)) is not None}
    operators = attempt("state", lambda: ckpt.operators, [])
    out = {
        "kind": "checkpoint", "location": ckpt.url, "query_id": query_id,
        "provider": provider, "provider_known": last is not None, "spark_state": provider == PROVIDER_CLASS,
        "batches": {"offsets": ckpt.offset_batches, "committed": ckpt.committed_batches,
                    "last": ckpt.last_batch, "last_committed": ckpt.last_committed, "restorable": [], "damaged": []},
        "num_partitions": partitions.get(last),
        "operators": [{"id": op.id, "name": op.name, "stores": list(op.stores)} for op in operators],
        "problems": problems,
    }
    if provider != PROVIDER_CLASS:
        if last is not None and not operators and not problems:
            out["note"] = (f"{ckpt.url} holds no state: its query has no stateful operator (no state/ directory), "
                           f"so there is nothing to read or migrate.")
        elif last is not None:
            runs_on = provider or "Spark's HDFS provider"
            out["note"] = (f"{ckpt.url} is not a spark_state checkpoint: it runs on {runs_on}, whose state "
                           f"spark-state does not read. `spark-state migrate {ckpt.url} NEW --to spark_state` "
                           f"writes a new checkpoint NEW that the query resumes from on spark_state.")
        return out
    candidates = [b for b in ckpt.committed_batches if b in partitions
                  and confs[b].get(PROVIDER_CLASS_CONF) == PROVIDER_CLASS]
    sids = sorted({StoreId(op.id, p, name) for op in operators for name in op.stores
                   for n in {partitions[b] for b in candidates} | {partitions.get(last, 0)} for p in range(n)})
    listing = listings()
    stores: dict[StoreId, StoreHealth] = {}
    with progress.task("checking stores", len(sids)) as task:
        for sid in sids:
            health = attempt(f"state/{sid.operator}/{sid.partition}",
                             lambda: store_health(sid, ckpt.store_root(sid), ckpt.store_root, listing))
            if health is not None:
                stores[sid] = health
            task.advance()
    for b in candidates:
        why = _why_not_restorable(b, [StoreId(op.id, p, name) for op in operators for name in op.stores
                                      for p in range(partitions[b])], stores)
        if why is None:
            out["batches"]["restorable"].append(b)
        elif why:
            out["batches"]["damaged"].append({"batch": b, "reason": why})
    now = {StoreId(op.id, p, name) for op in operators for name in op.stores for p in range(partitions.get(last, 0))}
    for op in out["operators"]:
        op["partitions"] = [{"name": h.sid.name, "partition": h.sid.partition, "root": Dir(h.root).url,
                             "versions": h.versions, "damaged": sorted(h.broken),
                             "files": sum(1 for p in h.files if p.startswith("shared/")),
                             "bytes": sum(h.files.values())}
                            for sid, h in stores.items() if sid.operator == op["id"] and sid in now]
    return out


def _why_not_restorable(batch: int, sids: list[StoreId], stores: dict[StoreId, StoreHealth]) -> str | None:
    """None when every store's version ``batch + 1`` loads; "" when retention dropped it (not restorable, not
    damaged); else why not."""
    version = batch + 1
    for sid in sids:
        health = stores.get(sid)
        if health is None:
            return f"store ({sid}) cannot be listed"
        if version in health.broken:
            return health.broken[version]
        if version not in health.versions:
            if health.versions and version < health.versions[0]:
                return ""
            return f"store ({sid}) has no version {version}"
    return None


def _histogram(kg: np.ndarray, max_parallelism: int) -> dict:
    counts = np.bincount(kg, minlength=max_parallelism) if len(kg) else np.zeros(max_parallelism, dtype=np.int64)
    nonzero = np.flatnonzero(counts)
    edges = np.linspace(0, max_parallelism, HISTOGRAM_BUCKETS + 1).astype(np.int64)
    buckets = [{"from": int(a), "to": int(b) - 1, "rows": int(counts[a:b].sum()),
                "key_groups": int(np.count_nonzero(counts[a:b]))} for a, b in zip(edges[:-1], edges[1:]) if b > a]
    top = nonzero[np.argsort(-counts[nonzero], kind="stable")][:10]
    used = counts[nonzero]
    return {
        "max_parallelism": max_parallelism, "key_groups_with_rows": int(len(nonzero)),
        "rows_per_key_group": {"min": int(used.min()) if len(used) else 0, "max": int(used.max()) if len(used) else 0,
                               "mean": float(used.mean()) if len(used) else 0.0},
        "largest": [{"kg": int(k), "rows": int(counts[k])} for k in top],
        "buckets": buckets,
        "rows": {str(int(k)): int(counts[k]) for k in nonzero},
    }


def store_report(location: str, operator: int, partition: int, store: str = DEFAULT_STORE, *,
                 batch: int | None = None, version: int | None = None,
                 options: Mapping[str, str] | Settings | None = None) -> dict:
    """One store at one version (default: the state of the latest committed batch): rows, key groups, chain."""
    ckpt = SparkCheckpoint(location, settings_from(options))
    if version is not None and batch is not None:
        raise CheckpointError("give a batch or a version, not both (the state of batch b is version b + 1).")
    at = ckpt.committed(batch)
    ckpt.require_spark_state(at)
    if version is None:
        version = at + 1
    elif version - 1 in ckpt.offset_batches:
        at = version - 1
    count = ckpt.num_partitions(at)
    if not 0 <= partition < count:
        raise CheckpointError(f"partition {partition} does not exist at batch {at} of {ckpt.url}: it has partitions "
                              f"0..{count - 1}.")
    ops = {op.id: op for op in ckpt.operators}
    if operator not in ops:
        raise CheckpointError(f"{ckpt.url} has no operator {operator}; its operators are {sorted(ops)}.")
    if store not in ops[operator].stores:
        raise CheckpointError(f"operator {operator} has no store {store!r}; its stores are {list(ops[operator].stores)}.")
    sid = StoreId(operator, partition, store)
    vs = ckpt.store(sid)
    present = vs.versions()
    if version not in present:
        raise CheckpointError(f"store ({sid}) has no version {version}; versions present: "
                              f"{format_versions(present)}. {ckpt.where_hint() if not present else ''}".strip())
    manifest = ckpt.manifest(sid, version)
    table = vs.load(version)
    kg = table.column("kg").to_numpy() if table.num_rows else np.zeros(0, dtype=np.int32)
    return {
        "location": ckpt.url, "operator": operator, "partition": partition, "store": store,
        "root": vs.storage.root, "version": version, "batch": version - 1, "rows": table.num_rows,
        "commit_id": manifest.commit_id, "format": manifest.format,
        "chain": [{"path": f.path, "kind": f.kind, "version": f.version, "rows": f.rows, "bytes": f.size,
                   "checksum": f.checksum,
                   # a rescaled chain: the file is in partition `partition`'s store; only pmod(hash, modulus) == residue
                   **({"partition": f.partition, "modulus": f.modulus, "residue": f.residue} if f.is_slice else {}),
                   **({"image": {"path": f.image.path, "bytes": f.image.size}} if f.image is not None else {})}
                  for f in manifest.files],
        # with N dividing M, partition p owns the key groups kg % N == p; otherwise ownership is per row
        "key_groups": {**_histogram(kg, manifest.max_parallelism),
                       "owned": len(owned_key_groups(partition, count, manifest.max_parallelism))
                       if divides(count, manifest.max_parallelism) else None},
    }


__all__ = ["overview", "store_report", "SparkStateError"]
