"""read_state and read_changes: one operator's state at a committed batch, and the changes each batch
made to it, as pyarrow Tables, without Spark.

State files are typed tables (file format 2), so reading state needs no
SparkSession, no JVM and no decoder of Spark's ``UnsafeRow``: the key and
value come back as struct columns with the operator's schemas, ready for
``duckdb``, ``polars.from_arrow`` or ``Table.to_pandas()``. Rows are what
``spark.read.format("statestore")`` returns for the same checkpoint, batch
and store (``tests/spark/test_read_state.py`` checks it for every operator), and
with ``readChangeFeed`` for ``read_changes`` (``tests/spark/test_history.py``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from spark_state.errors import CheckpointError
from spark_state.format.tables import cast_positional, is_typed
from spark_state.options import Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.storage.layout import DEFAULT_STORE, StoreId


def read_state(checkpoint_location: str, operator: int = 0, store_name: str | None = None,
               batch: int | None = None, partitions: Iterable[int] | None = None, *,
               options: Mapping[str, str] | Settings | None = None) -> pa.Table:
    """The state of `operator` after committed `batch` (default: the latest), every partition (or
    `partitions`): columns ``partition`` (int32), ``key`` and ``value`` (structs).

    `store_name` picks one of an operator's stores (a stream-stream join has four,
    e.g. ``left-keyToNumValues``); operators with one store need none. `options`
    are the query's spark_state options (``checkpointRoot`` if it set one).
    """
    ckpt = SparkCheckpoint(checkpoint_location, settings_from(options))
    at = ckpt.committed(batch)
    ckpt.require_spark_state(at)
    store_name = _store_name(ckpt, operator, store_name)
    tables = []
    for p in _partitions(ckpt, at, partitions):
        sid = StoreId(operator, p, store_name)
        state = _typed(ckpt.load_state(sid, at), sid, ckpt, at)
        tables.append(pa.table({"partition": pa.array([p] * state.num_rows, pa.int32()),
                                "key": state.column("key"), "value": state.column("value")}))
    return _concat(tables)


def read_changes(checkpoint_location: str, operator: int = 0, store_name: str | None = None, start_batch: int = 0,
                 end_batch: int | None = None, partitions: Iterable[int] | None = None, *,
                 options: Mapping[str, str] | Settings | None = None) -> pa.Table:
    """The changes batches `start_batch`..`end_batch` (default: the latest committed) made to `operator`'s state,
    every partition (or `partitions`): columns ``batch_id`` (int64), ``change_type`` (``update`` or
    ``delete``), ``key``, ``value`` (structs; null for a delete) and ``partition_id`` (int32), as
    ``spark.read.format("statestore").option("readChangeFeed", "true")`` returns them.

    Each key a batch wrote appears once, with its last write in that batch (Spark's HDFS provider lists
    every write). History goes back as far as retention keeps it (``spark.sql.streaming.minBatchesToRetain``);
    a range reaching past it raises HistoryUnavailable naming the batches, never a partial table.
    """
    ckpt = SparkCheckpoint(checkpoint_location, settings_from(options))
    end = ckpt.committed(end_batch)
    ckpt.require_spark_state(end)
    if not 0 <= start_batch <= end:
        raise CheckpointError(f"start batch {start_batch} (start_batch; CLI: --start-batch) is not a batch from 0 to "
                              f"the end batch {end} (end_batch; CLI: --end-batch, default the latest committed) of "
                              f"{ckpt.url}.")
    store_name = _store_name(ckpt, operator, store_name)
    tables = []
    for p in _partitions(ckpt, end, partitions):
        sid = StoreId(operator, p, store_name)
        for version, changes in ckpt.store(sid).history.changes(start_batch + 1, end + 1):
            changes = _typed(changes, sid, ckpt, version - 1)
            deleted = changes.column("value").is_null()
            rows = changes.num_rows
            tables.append(pa.table({
                "batch_id": pa.array([version - 1] * rows, pa.int64()),
                "change_type": pa.compute.if_else(deleted, "delete", "update"),
                "key": changes.column("key"), "value": changes.column("value"),
                "partition_id": pa.array([p] * rows, pa.int32())}))
    return _concat(tables)


def _partitions(ckpt: SparkCheckpoint, batch: int, partitions: Iterable[int] | None) -> list[int]:
    count = ckpt.num_partitions(batch)
    wanted = list(range(count)) if partitions is None else sorted(set(partitions))
    bad = [p for p in wanted if not 0 <= p < count]
    if bad:
        raise CheckpointError(f"partitions {bad} do not exist at batch {batch} of {ckpt.url}: it has partitions "
                              f"0..{count - 1}.")
    if not wanted:
        raise CheckpointError("no partitions asked for; pass partitions=None for all of them.")
    return wanted


def _typed(table: pa.Table, sid: StoreId, ckpt: SparkCheckpoint, batch: int) -> pa.Table:
    if not is_typed(table):
        raise CheckpointError(
            f"{sid} of {ckpt.url} at batch {batch} is stored in file format 1 (opaque UnsafeRow bytes): it cannot "
            f"be read without Spark. If a spark_state older than typed files wrote it, run the query for one more "
            f"batch with this spark_state (its first commit rewrites each store as typed files); if its state "
            f"schema holds a type Spark's Arrow conversion cannot map (the executor log says so), it stays in "
            f"format 1. "
            f"Either way spark.read.format('statestore') reads it.")
    return table


def _concat(tables: list[pa.Table]) -> pa.Table:
    target = unique_names(tables[-1].schema)
    return pa.concat_tables([as_table_of(t, target) for t in tables])


def _store_name(ckpt: SparkCheckpoint, operator: int, store_name: str | None) -> str:
    ops = {op.id: op for op in ckpt.operators}
    if operator not in ops:
        raise CheckpointError(f"no operator {operator} in {ckpt.url}; its stateful operators are "
                              f"{sorted(ops) or 'none'}.")
    names = ops[operator].stores
    if store_name is None:
        if len(names) == 1 or DEFAULT_STORE in names:
            return names[0] if len(names) == 1 else DEFAULT_STORE
        raise CheckpointError(f"operator {operator} ({ops[operator].name}) of {ckpt.url} has stores {list(names)}; "
                              f"pass store_name= one of them.")
    if store_name not in names:
        raise CheckpointError(f"operator {operator} ({ops[operator].name}) of {ckpt.url} has no store "
                              f"{store_name!r}; its stores are {list(names)}.")
    return store_name


def unique_names(schema: pa.Schema) -> pa.Schema:
    """Struct fields renamed where Spark gave two the same name (``sum``, ``sum``: ``sum``, ``sum_2``), so that
    DuckDB, Polars and pandas can address each; values and order are unchanged."""
    fields = []
    for field in schema:
        if pa.types.is_struct(field.type):
            seen: dict[str, int] = {}
            children = []
            for child in field.type:
                seen[child.name] = seen.get(child.name, 0) + 1
                name = child.name if seen[child.name] == 1 else f"{child.name}_{seen[child.name]}"
                children.append(child.with_name(name))
            field = field.with_type(pa.struct(children))
        fields.append(field)
    return pa.schema(fields)


def as_table_of(table: pa.Table, target: pa.Schema) -> pa.Table:
    """`table` with `target`'s schema (one of unique_names' schemas): fields matched by position."""
    return table if table.schema == target else cast_positional(table, target)
