"""The Spark jobs of a migration: every partition of one state store, read with Spark's ``statestore``
data source and written by the executors as the target provider's version of the batch.

One job per store, one task per state partition (the data source reads each partition of a store
in a Spark partition of its own), so no state passes through the driver and a task holds one
partition's rows at most:

- **to spark_state** (``write_spark_state``): Spark adds each row's partitioning hash with its own
  ``hash`` function (Murmur3, seed 42) over the key fields the shim hashes
  (``hash_field_count``, as ``KeyHasher.hashFieldCount`` in the shim); a Python task
  (``mapInArrow``) takes the partition's rows as Arrow, derives the key groups and writes them as
  a typed snapshot and its manifest: version ``batch + 1`` of the store, as a worker's first
  commit writes it.
- **to Spark's HDFS or RocksDB provider** (``write_provider``): a JVM task per partition drives
  ``HDFSBackedStateStoreProvider`` or ``RocksDBStateStoreProvider`` itself (the shim's
  ``ProviderStoreWriter``), so its files are the provider's own bytes.

Both report ``{partition: rows}`` for the check that follows (``migrate.py``).
"""

from __future__ import annotations

import json
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from spark_state.format import datafile
from spark_state.errors import StorageError
from spark_state.keygroups import key_groups_of, partitions_of
from spark_state.lifecycle.progress import Task
from spark_state.format.manifest import SNAPSHOT, FileEntry, Manifest
from spark_state.format.tables import cast_positional, typed_schema
from spark_state.options import Settings
from spark_state.storage import storage_for
from spark_state.storage.layout import StoreRef

#: The rows a writing task returns to the driver: one per state partition.
RESULT_SCHEMA = "partition int, rows long, bytes long"


def hash_field_count(key_fields: int, num_cols_prefix_key: int, store_name: str) -> int:
    """How many leading key fields Spark partitions a store's keys by (the shim's KeyHasher.hashFieldCount):
    the prefix of a prefix-scan store (session windows), all but the trailing ``index`` of a join's
    keyWithIndexToValue store, else every field."""
    if num_cols_prefix_key > 0:
        return num_cols_prefix_key
    if store_name.endswith("keyWithIndexToValue") and key_fields > 1:
        return key_fields - 1
    return key_fields


@dataclass(frozen=True)
class StoreJob:
    """What a task needs to write one partition of one store as spark_state (pickled to the executors)."""

    refs: tuple[StoreRef, ...]      # the target store of each partition, by partition
    settings: Settings
    version: int
    query_id: str
    key_type: pa.DataType           # the typed file's key and value structs, as the shim's Arrow conversion
    value_type: pa.DataType
    description: str

    @property
    def schema(self) -> pa.Schema:
        return typed_schema(self.key_type, self.value_type)


def arrow_struct(spark_type) -> pa.DataType:
    """A Spark struct type as Arrow, as Spark's ArrowUtils maps it (timestamps as UTC instants)."""
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(spark_type, timezone="UTC")
    except TypeError:   # pyspark 4.0's signature
        return to_arrow_type(spark_type, timestamp_utc=True)  # type: ignore[call-arg]


def write_snapshot(job: StoreJob, partition: int, table: pa.Table) -> tuple[int, int]:
    """Writes `table` (kg, hash, key, value) as version ``job.version`` of one store: a snapshot, then its
    manifest (which makes the version visible). Returns (rows, bytes written)."""
    ref = job.refs[partition]
    storage = storage_for(ref, job.settings)
    encoded = datafile.encode(table, job.settings.compression_level)
    path = storage.new_file_path(job.version, SNAPSHOT)
    storage.write_file(path, encoded.data)
    manifest = Manifest(job.version, job.settings.max_parallelism, (FileEntry.written(path, SNAPSHOT, job.version, encoded),),
                        rows=encoded.rows, query_id=job.query_id)
    body = manifest.to_json()
    storage.commit_manifest(job.version, body)
    return encoded.rows, encoded.size + len(body)


def _rows_of(batches: list[pa.RecordBatch], job: StoreJob, partition: int, num_partitions: int) -> pa.Table:
    """The partition's rows as the typed in-memory table (kg, hash, key, value), checked to be this partition's."""
    target = job.schema
    if not batches:
        return target.empty_table()
    read = pa.Table.from_batches(batches)
    hashes = read.column("hash").to_numpy(zero_copy_only=False).astype(np.int32)
    elsewhere = np.flatnonzero(partitions_of(hashes, num_partitions) != partition)
    if len(elsewhere):
        raise StorageError(
            f"{job.description}: a row of state partition {partition} has hash {int(hashes[elsewhere[0]])}, which "
            f"Spark routes to partition {int(partitions_of(hashes[elsewhere[:1]], num_partitions)[0])} of "
            f"{num_partitions}: the key fields hashed here are not the ones Spark partitions this store by. "
            f"Nothing was written for this store; please report it.")
    table = pa.table({"kg": pa.array(key_groups_of(hashes, job.settings.max_parallelism), pa.int32()),
                      "hash": pa.array(hashes, pa.int32()), "key": read.column("key"), "value": read.column("value")})
    return cast_positional(table, target)


def _write_partition(job: StoreJob, num_partitions: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the whole partition's rows into one snapshot (runs in a PySpark worker)."""
    from pyspark import TaskContext

    partition = TaskContext.get().partitionId()
    table = _rows_of(list(batches), job, partition, num_partitions)
    rows, written = write_snapshot(job, partition, table)
    yield pa.record_batch({"partition": pa.array([partition], pa.int32()), "rows": pa.array([rows], pa.int64()),
                           "bytes": pa.array([written], pa.int64())})


def write_spark_state(df, job: StoreJob, hash_fields: int, task: Task) -> dict[int, tuple[int, int]]:
    """Writes every partition of one store from `df` (the statestore reader's DataFrame of the source store).
    Returns {partition: (rows, bytes)}; partitions the job did not report (none expected) are written empty."""
    import functools

    from pyspark.sql import functions as F

    num_partitions = len(job.refs)
    key = _unique_names(df, "key")
    value = _unique_names(df, "value")
    key_fields = df.schema["key"].dataType.fields
    hashed = F.hash(*[key.getField(f"_{i}") if _has_duplicates(df, "key") else F.col("key").getField(f.name)
                      for i, f in enumerate(key_fields[:hash_fields])])
    rows = df.select(key.alias("key"), value.alias("value"), hashed.alias("hash"))
    written = {}
    with job_progress(df.sparkSession, job.description, task):
        for r in rows.mapInArrow(functools.partial(_write_partition, job, num_partitions), RESULT_SCHEMA).collect():
            written[r.partition] = (r.rows, r.bytes)
    for partition in range(num_partitions):
        if partition not in written:
            written[partition] = write_snapshot(job, partition, job.schema.empty_table())
    return written


def _has_duplicates(df, column: str) -> bool:
    names = df.schema[column].dataType.names
    return len(set(names)) != len(names)


def _unique_names(df, column: str):
    """The struct column with its fields renamed _0, _1, ... when two share a name (an aggregation with two
    ``sum``s): Spark's Arrow conversion refuses duplicate names; the file gets the original names back."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    if not _has_duplicates(df, column):
        return F.col(column)
    fields = df.schema[column].dataType.fields
    renamed = StructType([StructField(f"_{i}", f.dataType, f.nullable) for i, f in enumerate(fields)])
    return F.col(column).cast(renamed)


def write_provider(df, provider: str, state_root: str, operator: int, store_name: str, num_cols_prefix_key: int,
                   version: int, conf: dict[str, str], description: str, task: Task) -> dict[int, tuple[int, int]]:
    """Writes every partition of one store from `df` through Spark's `provider` ("hdfs" or "rocksdb") on the
    executors (``io.sparkstate.shim.ProviderStoreWriter``). Returns {partition: (rows, bytes)}."""
    spark = df.sparkSession
    jvm = spark.sparkContext._jvm
    jconf = jvm.java.util.HashMap()
    for k, v in conf.items():
        jconf.put(k, v)
    with job_progress(spark, description, task):
        results = jvm.io.sparkstate.shim.ProviderStoreWriter.write(df._jdf, provider, state_root, operator,
                                                                   store_name, num_cols_prefix_key, version, jconf)
    out = {}
    for text in results:
        r = json.loads(text)
        out[int(r["partition"])] = (int(r["rows"]), int(r["bytes"]))
    return out


@contextmanager
def job_progress(spark, description: str, task: Task, interval: float = 0.25):
    """Advances `task` by one per finished Spark task of the jobs run inside (a job group of their own)."""
    sc = spark.sparkContext
    group = f"spark_state-migrate-{uuid.uuid4().hex[:12]}"
    tracker = sc.statusTracker()
    done = threading.Event()
    reported = 0

    def finished_tasks() -> int:
        total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            for stage_id in (info.stageIds if info else ()):
                stage = tracker.getStageInfo(stage_id)
                total += stage.numCompletedTasks if stage else 0
        return total

    def poll() -> None:
        nonlocal reported
        while not done.wait(interval):
            now = finished_tasks()
            if now > reported:
                task.advance(now - reported)
                reported = now

    previous = (sc.getLocalProperty("spark.jobGroup.id"), sc.getLocalProperty("spark.job.description"))
    sc.setJobGroup(group, description)
    watcher = threading.Thread(target=poll, name="spark_state migrate progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        sc.setLocalProperty("spark.jobGroup.id", previous[0])
        sc.setLocalProperty("spark.job.description", previous[1])
    now = finished_tasks()
    if now > reported:
        task.advance(now - reported)
