"""The soak's end checks: every query's output and stored state equal the model's, every retained version
loads, ``spark-state validate`` is clean, no orphan file outlives the grace period, memory stayed bounded.

Each check returns a list of problems (empty: passed), so one run names every defect it found.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

from benchmarks.soak.model import Model
from spark_state.chain.references import Reference
from spark_state.errors import SparkStateError, VersionNotFound
from spark_state.format.manifest import CompactionRecord, Manifest
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.storage.layout import file_version

#: Problems listed per check at most (the count is always given).
SHOWN = 5
#: Partitions past the largest count in Spark's offset log that the orphan check looks for in storage.
PROBED_PARTITIONS = 4


def _ms(value) -> int:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else int(value)


def _limit(problems: list[str], what: str) -> list[str]:
    if len(problems) <= SHOWN:
        return problems
    return problems[:SHOWN] + [f"... {len(problems) - SHOWN} more {what}"]


# ----------------------------------------------------------------------- what the queries read


def source_files(checkpoint: Path, source: int = 0) -> set[str]:
    """Names of the input files Spark's file source handed to committed batches of this checkpoint."""
    ckpt = SparkCheckpoint(str(checkpoint))
    last = ckpt.last_committed
    if last is None:
        return set()
    upto = (ckpt.offsets(last).source_offset(source) or {}).get("logOffset", -1)
    names = set()
    for p in Path(checkpoint, "sources", str(source)).iterdir():
        if not (p.name.isdigit() or p.name.endswith(".compact")):
            continue
        for line in p.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("batchId", 0) <= upto:
                names.add(entry["path"].rsplit("/", 1)[-1])
    return names


def final_watermark(checkpoint: Path) -> int:
    """The event-time watermark of the last committed batch (ms): what its timeouts and evictions used."""
    ckpt = SparkCheckpoint(str(checkpoint))
    return int((ckpt.offsets(ckpt.last_committed).metadata or {}).get("batchWatermarkMs", 0))


# ----------------------------------------------------------------------- outputs


def _all_rows(outputs: dict[int, list[tuple]]) -> list[tuple]:
    return [r for rows in outputs.values() for r in rows]


def check_output(name: str, outputs: dict[int, list[tuple]], model: Model, watermark: int) -> list[str]:
    rows = _all_rows(outputs)
    problems = []
    if name == "agg":
        wrong = [r for r in rows if not model.agg_row_ok(*r)]
        problems += [f"agg row {r} is not the key's totals up to tick {r[3]}" for r in wrong]
        latest: dict[str, tuple] = {}
        for batch in sorted(outputs):
            for k, total, n, g in outputs[batch]:
                latest[k] = (total, n, g)
        expected = model.agg_latest()
        missing = sorted(set(expected) - set(latest))
        stale = sorted(k for k in expected if k in latest and latest[k] != expected[k])
        problems += [f"agg: key {k} never emitted" for k in missing]
        problems += [f"agg: key {k} last emitted {latest[k]}, expected {expected[k]}" for k in stale]
        return _limit(problems, "agg problems")
    expected = {"sessions": lambda: model.sessions_closed(watermark), "dedup": lambda: model.distinct,
                "join": model.joined}[name]()
    got = Counter(rows)
    doubled = sorted(r for r, c in got.items() if c > 1)
    problems += [f"{name}: row {r} emitted {got[r]} times" for r in doubled]
    problems += [f"{name}: row {r} missing" for r in sorted(expected - set(got))]
    problems += [f"{name}: row {r} not expected" for r in sorted(set(got) - expected)]
    return _limit(problems, f"{name} output problems")


# ----------------------------------------------------------------------- state


def _state(checkpoint: Path, options: dict, store: str | None = None) -> list[tuple[dict, dict]]:
    import spark_state

    table = spark_state.read_state(str(checkpoint), store_name=store, options=options)
    return list(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))


def _values(struct: dict) -> list:
    """A struct's leaf values in order (nested structs flattened)."""
    out = []
    for v in (struct or {}).values():
        out.extend(_values(v) if isinstance(v, dict) else [v])
    return out


def check_state(name: str, checkpoint: Path, options: dict, model: Model, watermark: int) -> list[str]:
    problems = []
    if name == "agg":
        got = {}
        for key, value in _state(checkpoint, options):
            v = _values(value)
            got[key["k"]] = (v[-3], v[-2])   # the aggregation buffer ends sum, count, max: keep sum and count
        expected = model.totals
    elif name == "sessions":
        got = {(k["s"], *_values(v)[:3]) for k, v in _state(checkpoint, options)}
        expected = model.sessions_open(watermark)
    elif name == "dedup":
        got = {(k["id"], _ms(k["t"])) for k, _ in _state(checkpoint, options)}
        expected = model.dedup_kept(watermark)
    else:
        return check_join_state(checkpoint, options, model, watermark)
    if got != expected:
        if isinstance(got, dict):
            diff = [f"{name} state: key {k}: stored {got.get(k)}, expected {expected.get(k)}"
                    for k in sorted(set(got) | set(expected)) if got.get(k) != expected.get(k)]
        else:
            diff = [f"{name} state: {r} stored, not expected" for r in sorted(got - expected)] + \
                   [f"{name} state: {r} expected, not stored" for r in sorted(expected - got)]
        problems += diff
    return _limit(problems, f"{name} state problems")


def check_join_state(checkpoint: Path, options: dict, model: Model, watermark: int) -> list[str]:
    """Every row the join keeps is an input row of its side, kept once, and every row the watermark has not
    passed is kept (it may still match; Spark evicts a side's rows only once the watermark is past them)."""
    problems = []
    sides = {"left": (model.left, lambda v: (v["oid"], _ms(v["lt"]))),
             "right": (model.right, lambda v: (v["roid"], _ms(v["rt"]), v["amount"]))}
    for side, (rows, row_of) in sides.items():
        stored = Counter(row_of(value) for _, value in _state(checkpoint, options, f"{side}-keyWithIndexToValue"))
        problems += [f"join {side} state: {r} stored {c} times" for r, c in sorted(stored.items()) if c > 1]
        problems += [f"join {side} state: {r} is no input row" for r in sorted(stored) if r not in rows]
        kept = {r for r in rows if r[1] > watermark}
        problems += [f"join {side} state: {r} evicted before the watermark passed it" for r in sorted(kept - set(stored))]
    return _limit(problems, "join state problems")


# ----------------------------------------------------------------------- storage


def check_versions_load(checkpoint: Path, options: dict) -> tuple[int, list[str]]:
    """Loads every retained version of every store of the checkpoint (checksums verified)."""
    ckpt = SparkCheckpoint(str(checkpoint), _settings(options))
    loaded, problems = 0, []
    for sid in ckpt.stores(ckpt.last_committed):
        store = ckpt.store(sid)
        for version in store.versions():
            try:
                store.load(version)
                loaded += 1
            except VersionNotFound:
                if version in store.versions():
                    problems.append(f"{checkpoint.name} store {sid}: version {version} listed, not found")
            except SparkStateError as err:
                problems.append(f"{checkpoint.name} store {sid}: version {version} does not load: {err}")
    return loaded, _limit(problems, "versions that do not load")


def check_validate(checkpoint: Path, options: dict) -> tuple[dict, list[str]]:
    """``spark-state validate`` as a user runs it."""
    conf = [a for k, v in options.items() for a in ("--conf", f"spark.sql.streaming.stateStore.sparkState.{k}={v}")]
    run = subprocess.run([sys.executable, "-m", "spark_state", "validate", str(checkpoint), "--json", "--no-progress",
                          *conf], capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(run.stdout)
    except ValueError:
        return {}, [f"spark-state validate {checkpoint} exited {run.returncode}: {run.stderr.strip()[-500:]}"]
    problems = [f"validate: {p.get('file')}: {p.get('message')}" for p in report.get("problems", [])]
    if run.returncode != 0 and not problems:
        problems.append(f"spark-state validate exited {run.returncode}: {run.stderr.strip()[-500:]}")
    return report, _limit(problems, "validate problems")


def unreferenced(world, checkpoint: Path, options: dict) -> set[str]:
    """Data files of the checkpoint's active stores that retention may delete now: nothing names them (no
    retained manifest or compaction record of any store of the checkpoint, rescaled slices included, no
    reference record) and they were written for a version below their store's oldest retained one. As
    ``<store id>: <path>``."""
    ckpt = SparkCheckpoint(str(checkpoint), _settings(options))
    active = set(ckpt.stores(ckpt.last_committed))
    # Spark purges old offset log entries, so partitions beyond today's count (a rescale down) are found in
    # storage: their manifests still name files of the active stores (rule 6's known cost).
    counts = {ckpt.num_partitions(b) for b in ckpt.offset_batches}
    every = {sid for sid in _sids(ckpt, max(counts) + PROBED_PARTITIONS) if sid in active or ckpt.versions(sid)}
    named: set[tuple[str, str]] = set()
    oldest: dict = {}
    for sid in every:
        root = ckpt.store_root(sid)
        store = ckpt.store(sid)
        versions = store.versions()
        if sid in active and versions:
            oldest[sid] = min(versions)
        for v in versions:
            try:
                manifest: Manifest = ckpt.manifest(sid, v)
            except SparkStateError:
                continue   # dropped by retention meanwhile: the second look decides
            for entry in manifest.files:
                holder = root if entry.partition is None else ckpt.store_root(_with_partition(sid, entry.partition))
                named.update((holder, p) for p in entry.paths)
            data = store.storage.read_record(v, "_snapshot")
            if data:
                named.update((root, p) for p in CompactionRecord.from_json(data, "record").snapshot.paths)
    for sid in active:   # reference records (rule 6): retention keeps the files of every live one
        root = ckpt.store_root(sid)
        refs = root.split(f"s3://{_bucket(root)}/", 1)[-1].rstrip("/") + "/refs/"
        for obj in world.objects(refs):
            data = world.s3().get_object(Bucket=_bucket(root), Key=obj["Key"])["Body"].read()
            named.update((root, p) for p in Reference.from_json(data, obj["Key"]).files)
    out = set()
    for sid in active:
        root = ckpt.store_root(sid)
        prefix = root.split(f"s3://{_bucket(root)}/", 1)[-1].rstrip("/") + "/shared/"
        for obj in world.objects(prefix):
            path = "shared/" + obj["Key"][len(prefix):]
            version = file_version(path)
            if (root, path) not in named and version is not None and version < oldest.get(sid, 0):
                out.add(f"{sid}: {path}")
    return out


def store_listing(world, checkpoint: Path, options: dict, small: int = 1 << 16) -> dict[str, dict]:
    """Every object of every store of the checkpoint (partitions beyond today's count included), by store id:
    the bodies of small records (manifests, compaction and reference records), the sizes of the others.
    Written beside the report when the orphan check fails, as the soak's S3 storage ends with the run."""
    ckpt = SparkCheckpoint(str(checkpoint), _settings(options))
    counts = {ckpt.num_partitions(b) for b in ckpt.offset_batches}
    listing: dict[str, dict] = {}
    for sid in sorted(_sids(ckpt, max(counts) + PROBED_PARTITIONS), key=str):
        root = ckpt.store_root(sid)
        prefix = root.split(f"s3://{_bucket(root)}/", 1)[-1].rstrip("/") + "/"
        objects = {}
        for obj in world.objects(prefix):
            key = obj["Key"]
            if key.endswith((".json", "/_metadata", "/_snapshot")) and obj["Size"] <= small:
                body = world.s3().get_object(Bucket=_bucket(root), Key=key)["Body"].read()
                objects[key[len(prefix):]] = body.decode("utf-8", "replace")
            else:
                objects[key[len(prefix):]] = obj["Size"]
        if objects:
            listing[f"{sid} ({root})"] = objects
    return listing


def orphans(first: set[str], second: set[str], waited_s: float, grace_s: float) -> tuple[int, list[str]]:
    """Files retention may delete at both looks, ``waited_s`` (more than the grace period) apart, and still
    there when the watch after the second look ended: orphans."""
    left = sorted(first & second)
    return len(left), _limit([f"{f} unreferenced for over {waited_s:.0f}s (grace {grace_s:.0f}s)" for f in left],
                             "orphans")


def _sids(ckpt: SparkCheckpoint, partitions: int):
    from spark_state.storage.layout import StoreId

    return {StoreId(op.id, p, name) for op in ckpt.operators for name in op.stores for p in range(partitions)}


def _with_partition(sid, partition: int):
    from dataclasses import replace

    return replace(sid, partition=partition)


def _bucket(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


def _settings(options: dict):
    from spark_state.options import settings_from

    return settings_from(options)


# ----------------------------------------------------------------------- memory


def check_memory(samples: list[dict], min_minutes: float = 10.0) -> tuple[dict, list[str]]:
    """Memory did not grow without bound: per kind of process, the peak of the last third of the run is at
    most the peak of the middle third plus 25% and 64 MiB. Runs shorter than ``min_minutes`` only report."""
    series = {
        "spark_state workers (sum)": [sum(v for v in s["workers"].values() if v) for s in samples],
        "executor JVMs (sum)": [sum(v for v in s["executors"].values() if v) for s in samples],
        "driver JVM": [s["driver_jvm"] or 0 for s in samples],
        "harness (driver Python)": [s["harness"] or 0 for s in samples],
    }
    figures, problems = {}, []
    span = (samples[-1]["elapsed_s"] - samples[0]["elapsed_s"]) / 60 if len(samples) > 1 else 0
    for what, values in series.items():
        third = len(values) // 3
        if third == 0:
            continue
        middle, last = max(values[third:2 * third]), max(values[2 * third:])
        figures[what] = {"peak_middle_third_mib": middle, "peak_last_third_mib": last, "max_mib": max(values)}
        if span >= min_minutes and last > middle * 1.25 + 64:
            problems.append(f"{what}: peak {last:.0f} MiB in the last third against {middle:.0f} MiB in the middle")
    return figures, problems
