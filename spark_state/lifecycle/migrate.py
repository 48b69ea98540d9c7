"""Migrate: a stopped query's checkpoint onto spark_state, or off it to Spark's HDFS or RocksDB provider.

Spark pins ``spark.sql.streaming.stateStore.providerClass`` in the offset log, so a restarted query
keeps the provider its checkpoint was written with. ``migrate`` writes a **new checkpoint** (like
``restore``: a new query id, the source never changes) that the same query resumes from with the
next batch, on the other provider:

- the offset log up to the last committed batch ``b``, each entry with the provider conf changed,
  the commit log and the sources' logs up to ``b``, Spark's own files under ``state/`` (operator
  metadata, state schemas);
- every store's state at ``b`` as version ``b + 1`` of the target provider, read with Spark's own
  ``statestore`` data source (any provider: HDFS, RocksDB with or without changelog checkpointing,
  spark_state) and written by the executors, one task per state partition (see
  ``migrate_stores``): a spark_state snapshot and manifest per store, or the HDFS or RocksDB
  provider's snapshot written by that provider's own code;
- ``metadata`` (the new query id) last, so an interrupted migration is never taken for a good one.

Then Spark's ``statestore`` reader reads the target back and every store partition must hold the
rows that were written; if not, or if anything fails once writing started, the target is removed.

Refused before anything is written, with what to do: a query of the checkpoint running, a last
batch that started but did not commit, a provider other than these three, checkpoint format v2
(state store checkpoint ids), ``transformWithState`` state (column families, several values per
key), a non-empty target, memory storage. Reading and writing need a SparkSession: the active one
(a notebook's), else a local one started for the migration and stopped after it, whose JVM starts in
an empty directory of its own: Spark's Python workers put their working directory first on
``sys.path``, so a ``spark_state/`` directory where ``spark-state migrate`` was run would shadow the
installed package in them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from spark_state import PROVIDER_CLASS
from spark_state.errors import CheckpointError
from spark_state.lifecycle.cut import Item, NewCheckpoint, copy_items, log_items, source_items
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.rescale import active_query_ids
from spark_state.options import PREFIX, Settings, settings_from
from spark_state.spark.checkpoint import (CHECKPOINT_FORMAT_CONF, SparkCheckpoint, require_filesystem_storage,
                                         spark_state_root, store_ref, store_root)
from spark_state.spark.files import PROVIDER_CLASS_CONF, OffsetSeq, query_metadata
from spark_state.storage.directory import Dir
from spark_state.storage.layout import DEFAULT_STORE, STORE_ENTRIES, StoreId

#: The local Spark's log configuration while it starts (setLogLevel("OFF") once it has): errors only, as a failure
#: is raised and spark-state says it in one line. A driver started from Python counts as a shell: Spark gives the
#: root the level of the gateway's logger (WARN unless configured) and prints two lines saying so, unless equal.
QUIET_LOG4J = """rootLogger.level = error
logger.repl.name = org.apache.spark.api.python.PythonGatewayServer
logger.repl.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: The providers a checkpoint can be migrated from, by the names the results use.
SOURCES = {HDFS_PROVIDER: "hdfs", ROCKSDB_PROVIDER: "rocksdb", PROVIDER_CLASS: "spark_state"}
#: The providers a checkpoint can be migrated to (``to=``).
TARGETS = {"spark_state": PROVIDER_CLASS, "hdfs": HDFS_PROVIDER, "rocksdb": ROCKSDB_PROVIDER}
#: Confs the HDFS provider reads for its file format, taken from the offset log the migrated query restores.
HDFS_FILE_CONFS = ("spark.sql.streaming.stateStore.compression.codec",
                   "spark.sql.streaming.stateStore.rowChecksum.enabled")
#: The prefix of the confs Spark's RocksDB provider reads (its own options, compression, row checksums, ...):
#: those of the offset log go to the provider that writes the migrated state, as the restarted query reads it.
STATE_STORE_CONFS = "spark.sql.streaming.stateStore."


@dataclass(frozen=True)
class Migrated(NewCheckpoint):
    source_provider: str     # "hdfs", "rocksdb" or "spark_state"
    target_provider: str     # "spark_state", "hdfs" or "rocksdb"
    stores: int              # store partitions written
    rows: int
    bytes: int               # state bytes written
    seconds: float


@dataclass(frozen=True)
class StorePlan:
    """One store of one stateful operator, as Spark's operator metadata describes it."""

    operator: int
    name: str
    num_cols_prefix_key: int

    def __str__(self) -> str:
        return f"operator {self.operator}" + ("" if self.name == DEFAULT_STORE else f" store {self.name}")


def _require_stopped(ckpt: SparkCheckpoint) -> int:
    """The last committed batch, or a refusal while the query runs or its last batch did not commit."""
    committed = ckpt.committed()
    if ckpt.query_id in active_query_ids():
        raise CheckpointError(f"query {ckpt.query_id} is running in this Spark session; stop it (query.stop()) "
                              f"before migrating {ckpt.url}.")
    if ckpt.last_batch is not None and ckpt.last_batch > committed:
        raise CheckpointError(
            f"batch {ckpt.last_batch} of {ckpt.url} started but did not commit (last committed: {committed}): the "
            f"query is running, or its last batch failed. Stop the query, or restart it on its own provider and "
            f"let it commit a batch, then migrate.")
    return committed


def _source_provider(ckpt: SparkCheckpoint, batch: int, to: str) -> str:
    provider = ckpt.provider(batch) or HDFS_PROVIDER   # Spark's default when the offset log names none
    if provider not in SOURCES:
        raise CheckpointError(
            f"{ckpt.url} runs on the state store provider {provider}; migrate reads checkpoints of Spark's HDFS "
            f"provider, Spark's RocksDB provider and spark_state only.")
    if TARGETS[to] == provider:
        raise CheckpointError(f"{ckpt.url} already runs on {to} ({provider}); to copy it to a new location use "
                              f"spark-state restore (spark_state) or copy the directory.")
    conf = ckpt.offsets(batch).conf
    commit = ckpt.commit(batch)
    if conf.get(CHECKPOINT_FORMAT_CONF, "1") != "1" or commit.get("stateUniqueIds"):
        raise CheckpointError(
            f"{ckpt.url} uses checkpoint format v{conf.get(CHECKPOINT_FORMAT_CONF, 2)} (state store checkpoint "
            f"ids, {CHECKPOINT_FORMAT_CONF}; Spark 4.3's real-time mode sets it); migrate carries format v1 "
            f"checkpoints only. Nothing was written. Run the query with {CHECKPOINT_FORMAT_CONF}=1 from a new "
            f"checkpoint, or move its state by hand with Spark's state reader (docs/operating.md, \"Moving to "
            f"transformWithState\").")
    return SOURCES[provider]


def _stores(ckpt: SparkCheckpoint) -> list[StorePlan]:
    """Every store of every stateful operator, refusing state migrate cannot carry."""
    out = []
    for op in ckpt.operators:
        name = op.name if op.metadata is not None else _operator_name_v2(ckpt, op.id)
        if "transformwithstate" in name.lower() or ckpt.dir.exists(f"state/{op.id}/_stateSchema"):
            raise CheckpointError(
                f"operator {op.id} of {ckpt.url} is {name}: transformWithState keeps state in several column "
                f"families with several values per key, which only Spark's RocksDB provider implements (spark_state "
                f"and the HDFS provider do not); such a checkpoint cannot be migrated.")
        if op.metadata is None:
            raise CheckpointError(
                f"operator {op.id} of {ckpt.url} has no operator metadata (state/{op.id}/_metadata/metadata), "
                f"which Spark 3.5 and later write; restart the query once with a current Spark, then migrate.")
        prefix = {str(s.get("storeName")): int(s.get("numColsPrefixKey") or 0)
                  for s in op.metadata.raw.get("stateStoreInfo", [])}
        out += [StorePlan(op.id, store, prefix.get(store, 0)) for store in op.stores]
    return out


def _operator_name_v2(ckpt: SparkCheckpoint, operator: int) -> str:
    """The operator's name from operator metadata v2 (``state/<op>/_metadata/v2/<batch>``, transformWithState's),
    or "an operator of unknown kind"."""
    rel = f"state/{operator}/_metadata/v2"
    batches = sorted(int(n) for n in ckpt.dir.listdir(rel) if n.isdigit())
    if batches:
        try:
            line = ckpt.dir.read(f"{rel}/{batches[-1]}").decode("utf-8", "replace").split("\n")[1]
            return str(json.loads(line)["operatorInfo"]["operatorName"])
        except (IndexError, KeyError, TypeError, ValueError):
            pass
    return "an operator of unknown kind"


def _spark_state_dir_files(ckpt: SparkCheckpoint) -> list[Item]:
    """Spark's own files under ``state/`` (operator metadata, state schemas), not any provider's state files."""
    out = []
    for path in ckpt.dir.files("state"):
        parts = path.split("/")
        if parts[-1].endswith((".crc", ".tmp")):
            continue
        if len(parts) > 3 and parts[2].isdigit():   # inside a partition: only a store's _metadata/ (its schema)
            inner = parts[3:]
            if not (inner[0] == "_metadata" or (len(inner) > 2 and inner[1] == "_metadata"
                                                and not inner[0].startswith(STORE_ENTRIES))):
                continue
        out.append(Item(path, ckpt.dir, path))
    return out


def _require_empty(target: Dir, what: str) -> None:
    occupied = target.occupied()
    if occupied:
        raise CheckpointError(f"refusing to migrate into {target.url}: {what} is not new or empty ({occupied}). "
                              f"Migrate writes a new checkpoint and never overwrites one; give a new or empty location.")


def _spark_path(location: Dir) -> str:
    return location.full() if location.local else location.url


def _spark_state_conf(options) -> dict[str, str]:
    """The spark_state options as session conf entries, for the shim that reads or verifies spark_state state."""
    if isinstance(options, Settings):
        return options.to_conf()
    return {(k if k.startswith(PREFIX) else PREFIX + k): str(v) for k, v in dict(options or {}).items()}


@contextmanager
def _session() -> Iterator:
    """The active SparkSession, with the spark_state jar loaded (the shim reads and verifies spark_state state
    and writes the HDFS provider's files), else a local one started for the migration."""
    from pyspark.sql import SparkSession

    import spark_state

    active = SparkSession.getActiveSession()
    if active is not None:
        from spark_state.spark.config import ensure_driver_classpath

        try:
            active.sparkContext
        except Exception:  # noqa: BLE001 - Spark Connect: no driver in this process
            raise CheckpointError("migrate runs Spark jobs with the spark_state jar on a driver in this process; the "
                                  "active session is a Spark Connect client. Run spark-state migrate (it starts a "
                                  "local Spark), or call migrate from a classic SparkSession.") from None
        jar = str(spark_state.shim_jar())
        ensure_driver_classpath(active, jar)
        if jar not in (active.sparkContext.getConf().get("spark.jars") or ""):
            active.sparkContext.addJar(jar)
        yield active
        return
    builder = (SparkSession.builder.master("local[*]").appName("spark_state migrate")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    with tempfile.TemporaryDirectory(prefix="spark-state-migrate-") as home, _launching_in(home):
        # Spark's start-up warnings (a loopback hostname, no native Hadoop) would come before the one result line
        quiet = Path(home, "log4j2.properties")
        quiet.write_text(QUIET_LOG4J)
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={quiet.as_uri()}")
        spark = spark_state.configure(builder, prestart_worker=False).getOrCreate()
        spark.sparkContext.setLogLevel("OFF")   # a failure is raised here, and spark-state says it in one line
        try:
            yield spark
        finally:
            spark.stop()


@contextmanager
def _launching_in(home: str) -> Iterator[None]:
    """While a local Spark starts: its JVM works in `home` (see the module docstring), and its Python workers run
    this Python, which has spark_state (pyspark reads ``PYSPARK_PYTHON`` when the context starts, else runs
    ``python3`` from PATH)."""
    here, python = os.getcwd(), os.environ.get("PYSPARK_PYTHON")
    os.chdir(home)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        os.chdir(here)
        if python is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = python


@contextmanager
def _session_conf(spark, conf: Mapping[str, str]) -> Iterator[None]:
    saved = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _read_store(spark, checkpoint: Dir, batch: int, store: StorePlan):
    return (spark.read.format("statestore").option("batchId", batch).option("operatorId", store.operator)
            .option("storeName", store.name).load(_spark_path(checkpoint)))


def _verify(spark, target: Dir, batch: int, written: dict[StorePlan, dict[int, tuple[int, int]]]) -> None:
    """Spark's statestore reader finds, in every store partition of the target, the rows that were written."""
    for store, by_partition in written.items():
        rows = _read_store(spark, target, batch, store).groupBy("partition_id").count().collect()
        found = {r["partition_id"]: r["count"] for r in rows}
        expected = {p: n for p, (n, _) in by_partition.items() if n}
        if found != expected:
            raise CheckpointError(
                f"{store} of the migrated checkpoint {target.url}: Spark's statestore reader finds rows per "
                f"partition {dict(sorted(found.items()))}, {dict(sorted(expected.items()))} were written. The "
                f"migration was undone; please report this.")


def _remove(location: Dir) -> None:
    if location.exists():
        location.fs.rm(location.full(), recursive=True)


@dataclass(frozen=True)
class _Plan:
    """A migration whose every refusal was checked: what is read, what is written where."""

    ckpt: SparkCheckpoint
    target: Dir
    to: str
    settings: Settings
    batch: int
    source: str
    stores: tuple[StorePlan, ...]
    num_partitions: int
    query_id: str

    def store_ids(self) -> Iterator[StoreId]:
        for store in self.stores:
            for p in range(self.num_partitions):
                yield StoreId(store.operator, p, store.name)

    def roots_elsewhere(self) -> list[Dir]:
        """The target's store directories under checkpointRoot (spark_state target with that option), if any."""
        if self.to != "spark_state" or self.settings.checkpoint_root is None:
            return []
        return [Dir(store_root(self.target, sid, self.settings, self.query_id)) for sid in self.store_ids()]


def _plan(checkpoint_location: str, target: str, to: str, settings: Settings) -> _Plan:
    """Checks everything a migration refuses, before anything is written."""
    if to not in TARGETS:
        raise CheckpointError(f"cannot migrate to {to!r}; choose one of {', '.join(TARGETS)}.")
    if to == "rocksdb":
        _require_spark_for_rocksdb()
    require_filesystem_storage(settings, "it can neither be read from outside nor hold migrated state")
    src, dst = Dir(checkpoint_location), Dir(target)
    if src.url == dst.url:
        raise CheckpointError(f"source and target are both {src.url}; migrate into a new location.")
    _require_empty(dst, "the target location")
    ckpt = SparkCheckpoint(src, settings)
    batch = _require_stopped(ckpt)
    plan = _Plan(ckpt, dst, to, settings, batch, _source_provider(ckpt, batch, to), tuple(_stores(ckpt)),
                 ckpt.num_partitions(batch), str(uuid.uuid4()))
    if plan.source == "spark_state":
        for sid in plan.store_ids():
            if batch + 1 not in ckpt.versions(sid):
                raise CheckpointError(f"store ({sid}) of {ckpt.url} has no version {batch + 1}, the state of batch "
                                      f"{batch}. {ckpt.where_hint()}")
    for sid, root in zip(plan.store_ids(), plan.roots_elsewhere()):
        _require_empty(root, f"the directory of store ({sid}) under checkpointRoot")
    return plan


def _require_spark_for_rocksdb() -> None:
    """Writing a version of Spark's RocksDB provider from scratch (an empty store committed with its snapshot, as
    Spark's offline repartition does) needs the provider API of Spark 4.2."""
    import pyspark

    major, minor = (int(part) for part in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        raise CheckpointError(
            f"migrate --to rocksdb writes the state through Spark's RocksDB provider as Spark 4.2+ writes a "
            f"version from scratch; this is pyspark {pyspark.__version__}. Nothing was written. Run the migration "
            f"with pyspark 4.2 or later (the migrated checkpoint then runs on the query's own Spark 4.2+).")


def migrate(checkpoint_location: str, target: str, to: str = "spark_state", *,
            options: Mapping[str, str] | Settings | None = None, progress: Progress = Progress()) -> Migrated:
    """Writes `target` (new or empty) so the query of `checkpoint_location` resumes there on provider `to`.

    `to` is ``"spark_state"`` (from a checkpoint of Spark's HDFS or RocksDB provider), ``"hdfs"``
    (Spark's default provider, from a spark_state or RocksDB checkpoint) or ``"rocksdb"`` (Spark's RocksDB
    provider, from a spark_state or HDFS checkpoint; written with pyspark 4.2+). `options` are spark_state
    options: the target's (``checkpointRoot``, ``maxParallelism``, ``compressionLevel``) when migrating to
    spark_state, the source query's (its ``checkpointRoot``) when migrating from it. Start the same query
    with ``checkpointLocation=target`` afterwards (with ``spark_state.configure`` and the same options for
    ``to="spark_state"``); it resumes with the batch after the source's last committed one.
    """
    started = time.perf_counter()
    settings = settings_from(options)
    plan = _plan(checkpoint_location, target, to, settings)
    with _session() as spark, _session_conf(spark, _spark_state_conf(options)):
        try:
            written = _write(spark, plan, progress)
            _verify(spark, plan.target, plan.batch, written)
        except BaseException:
            for location in [plan.target, *plan.roots_elsewhere()]:
                _remove(location)
            raise
    rows = sum(r for by_partition in written.values() for r, _ in by_partition.values())
    size = sum(b for by_partition in written.values() for _, b in by_partition.values())
    return Migrated(plan.target.url, plan.query_id, plan.batch, plan.ckpt.url, plan.ckpt.query_id, plan.source, to,
                    len(plan.stores) * plan.num_partitions, rows, size, time.perf_counter() - started)


def _write(spark, plan: _Plan, progress: Progress) -> dict[StorePlan, dict[int, tuple[int, int]]]:
    """Offsets first, then every store, Spark's state metadata, the sources' and commit logs, ``metadata`` last."""
    ckpt, batch = plan.ckpt, plan.batch
    offsets = [Item(i.rel, data=OffsetSeq.parse(i.fetch(), ckpt.dir.url_of(i.rel))
                    .with_conf({PROVIDER_CLASS_CONF: TARGETS[plan.to]}).to_bytes())
               for i in log_items(ckpt, "offsets", batch)]
    copy_items(offsets, lambda rel: (plan.target, rel), progress, "writing the offset log")
    written = {}
    with progress.task(f"migrating the state of batch {batch} to {plan.to}", len(plan.stores) * plan.num_partitions) \
            as task:
        for store in plan.stores:
            written[store] = _write_store(spark, plan, store, task)
    logs = (_spark_state_dir_files(ckpt) + source_items(ckpt, batch) + log_items(ckpt, "commits", batch)
            + [Item("metadata", data=query_metadata(plan.query_id))])
    copy_items(logs, lambda rel: (plan.target, rel), progress, "copying logs and Spark's state metadata")
    return written


def _provider_confs(plan: _Plan) -> dict[str, str]:
    """The confs of the source's offset log that Spark's target provider reads for its file format (HDFS: codec and
    row checksums; RocksDB: every state store conf but the provider's and spark_state's own)."""
    conf = plan.ckpt.offsets(plan.batch).conf
    if plan.to == "hdfs":
        return {k: v for k, v in conf.items() if k in HDFS_FILE_CONFS}
    return {k: v for k, v in conf.items()
            if k.startswith(STATE_STORE_CONFS) and k != PROVIDER_CLASS_CONF and not k.startswith(PREFIX)}


def _write_store(spark, plan: _Plan, store: StorePlan, task) -> dict[int, tuple[int, int]]:
    from spark_state.lifecycle import migrate_stores as jobs

    df = _read_store(spark, plan.ckpt.dir, plan.batch, store)
    version = plan.batch + 1
    if plan.to in ("hdfs", "rocksdb"):
        return jobs.write_provider(df, plan.to, spark_state_root(plan.target), store.operator, store.name,
                                   store.num_cols_prefix_key, version, _provider_confs(plan), f"migrating {store}",
                                   task)
    key, value = df.schema["key"].dataType, df.schema["value"].dataType
    try:
        key_type, value_type = jobs.arrow_struct(key), jobs.arrow_struct(value)
    except Exception as err:  # noqa: BLE001 - pyspark's own conversion error names the type
        raise CheckpointError(
            f"{store} of {plan.ckpt.url} holds state of a type Spark's Arrow conversion cannot map ({err}); "
            f"spark_state keeps such state as opaque rows, which migrate cannot write.") from None
    refs = tuple(store_ref(plan.target, StoreId(store.operator, p, store.name), plan.query_id)
                 for p in range(plan.num_partitions))
    job = jobs.StoreJob(refs, plan.settings, version, plan.query_id, key_type, value_type, f"migrating {store}")
    hashed = jobs.hash_field_count(len(key.fields), store.num_cols_prefix_key, store.name)
    return jobs.write_spark_state(df, job, hashed, task)


__all__ = ["Migrated", "migrate", "HDFS_PROVIDER", "ROCKSDB_PROVIDER"]
