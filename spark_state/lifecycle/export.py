"""export: the state of one committed batch as Parquet, one file per store and partition.

Layout: ``<output>/operator=<op>/store=<name>/part-<partition>.parquet``
(Hive-style directories, so ``pyarrow.dataset`` and ``spark.read.parquet``
see ``operator`` and ``store`` as columns). Each file holds the store's rows
as spark_state keeps them: ``partition``, ``kg``, ``hash``, then ``key`` and
``value`` (the bytes of Spark's ``UnsafeRow``s in file format 1; typed
columns where the files are typed).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from spark_state.errors import CheckpointError
from spark_state.format.tables import is_typed
from spark_state.lifecycle.progress import Progress
from spark_state.lifecycle.reading import as_table_of, unique_names
from spark_state.options import Settings, settings_from
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.storage.directory import Dir


@dataclass(frozen=True)
class Exported:
    output: str
    batch: int
    files: int
    rows: int


def export(checkpoint_location: str, output: str, *, batch: int | None = None,
           operators: Iterable[int] | None = None, options: Mapping[str, str] | Settings | None = None,
           progress: Progress = Progress()) -> Exported:
    """Writes the state at committed `batch` (default: the latest) under `output` (new or empty)."""
    ckpt = SparkCheckpoint(checkpoint_location, settings_from(options))
    at = ckpt.committed(batch)
    ckpt.require_spark_state(at)
    out = Dir(output)
    occupied = out.occupied()
    if occupied:
        raise CheckpointError(f"refusing to export into {out.url}: {occupied}; give a new or empty directory.")
    wanted = None if operators is None else set(operators)
    stores = [sid for sid in ckpt.stores(at) if wanted is None or sid.operator in wanted]
    if wanted is not None and not stores:
        known = sorted({op.id for op in ckpt.operators})
        raise CheckpointError(f"no operator {sorted(wanted)} in {ckpt.url}; its operators are {known}.")
    files = rows = 0
    with progress.task(f"exporting batch {at}", len(stores)) as task:
        for sid in stores:
            table = ckpt.load_state(sid, at)
            if is_typed(table):   # Spark may repeat a field name (sum, sum); Parquet readers need them unique
                # by position: Table.cast matches struct fields by name
                table = as_table_of(table, unique_names(table.schema))
            table = table.add_column(0, "partition", pa.array([sid.partition] * table.num_rows, pa.int32()))
            sink = io.BytesIO()
            pq.write_table(table, sink, compression="zstd")
            out.copy_in(f"operator={sid.operator}/store={sid.name}/part-{sid.partition:05d}.parquet", sink.getvalue())
            files += 1
            rows += table.num_rows
            task.advance()
    return Exported(out.url, at, files, rows)
