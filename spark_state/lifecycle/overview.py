"""What ``spark-state ls`` and ``spark-state inspect`` report, as plain dicts (the CLI renders them
or prints them as JSON)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from spark_state import PROVIDER_CLASS
from spark_state.errors import CheckpointError, SparkStateError
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.savepoint import is_savepoint, read_savepoint
from spark_state.options import Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.storage.directory import Dir
from spark_state.storage.layout import DEFAULT_STORE, StoreId, format_versions

HISTOGRAM_BUCKETS = 20


def overview(location: str, *, options: Mapping[str, str] | Settings | None = None,
             progress: Progress = Progress()) -> dict:
    """A checkpoint's query, batches, operators and stores (versions, files, bytes); or a savepoint's listing."""
    where = Dir(location)
    if is_savepoint(where):
        meta = read_savepoint(where)
        return {"kind": "savepoint", "location": where.url, "query_id": meta.query_id, "batch": meta.batch,
                "num_partitions": meta.num_partitions, "max_parallelism": meta.max_parallelism,
                "source": meta.source, "created_ms": meta.created_ms, "stores": list(meta.stores),
                "files": len(meta.files), "bytes": sum(f.size for f in meta.files)}
    ckpt = SparkCheckpoint(where, settings_from(options))
    last = ckpt.last_batch
    provider = ckpt.provider(last) if last is not None else None
    out = {
        "kind": "checkpoint", "location": ckpt.url, "query_id": ckpt.query_id,
        "provider": provider, "spark_state": provider == PROVIDER_CLASS,
        "batches": {"offsets": ckpt.offset_batches, "committed": ckpt.committed_batches,
                    "last": last, "last_committed": ckpt.last_committed},
        "num_partitions": ckpt.num_partitions(last) if last is not None else None,
        "operators": [],
    }
    if provider != PROVIDER_CLASS or last is None:
        out["batches"]["restorable"] = []
        out["operators"] = [{"id": op.id, "name": op.name, "stores": list(op.stores)} for op in ckpt.operators]
        return out
    out["batches"]["restorable"] = ckpt.restorable_batches()
    sids = ckpt.stores(last)
    stores: dict[int, list] = {}
    with progress.task("listing stores", len(sids)) as task:
        for sid in sids:
            root = Dir(ckpt.store_root(sid))
            files = root.files()
            versions = sorted(int(p.split("/")[0][4:]) for p in files if p.startswith("chk-") and p.endswith("/_metadata"))
            stores.setdefault(sid.operator, []).append({
                "name": sid.name, "partition": sid.partition, "root": root.url, "versions": versions,
                "files": sum(1 for p in files if p.startswith("shared/")), "bytes": sum(files.values()),
            })
            task.advance()
    for op in ckpt.operators:
        out["operators"].append({"id": op.id, "name": op.name, "stores": list(op.stores),
                                 "partitions": stores.get(op.id, [])})
    return out


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
    if version is None:
        version = ckpt.committed(batch) + 1
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
                   **({"partition": f.partition, "modulus": f.modulus, "residue": f.residue} if f.is_slice else {})}
                  for f in manifest.files],
        "key_groups": _histogram(kg, manifest.max_parallelism),
    }


__all__ = ["overview", "store_report", "SparkStateError"]
