"""What spark_state stored is right: every row sits in the key group and Spark partition its
hash says (so the hash is Spark's partition hash), row counts match Spark's own view of the
state, and eviction by watermark removes rows from storage too."""

from __future__ import annotations

import numpy as np
import pytest

from spark_state.options import DEFAULT_MAX_PARALLELISM
from tests.support.scenarios import JOIN_STORES
from tests.support.spark import statestore_rows
from tests.support.stores import open_stored

STORES = [
    ("agg_update", 0, "default"),
    ("window_agg_update", 0, "default"),
    ("dedup_watermark", 0, "default"),
    ("session_window", 0, "default"),
    *[("join_left_outer", 0, store) for store in JOIN_STORES],
    ("apply_in_pandas_then_window_agg", 0, "default"),
    ("apply_in_pandas_then_window_agg", 1, "default"),
]


@pytest.fixture
def tested_spark_state(tested):
    if tested != "spark_state":
        pytest.skip("reads spark_state's own files")


def _reader_counts(spark, checkpoint, batch, operator, store):
    """Rows per partition in Spark's statestore reader output."""
    options = {"batchId": batch, "operatorId": operator}
    if store != "default":
        options["storeName"] = store
    counts: dict[int, int] = {}
    for row in statestore_rows(spark, checkpoint, **options):
        counts[row[-1]] = counts.get(row[-1], 0) + 1  # partition_id is the last column
    return counts


@pytest.mark.parametrize("name,operator,store", STORES, ids=[f"{n}-{o}-{s}" for n, o, s in STORES])
def test_stored_rows_sit_in_their_spark_partition(spark, scenario_run, tested_spark_state, name, operator, store):
    twin = scenario_run(name)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    total = 0
    for batch in (twin.test.run_ends[0], twin.test.run_ends[-1]):
        expected_counts = _reader_counts(spark, twin.ref.checkpoint, batch, operator, store)
        for partition in range(partitions):
            stored = open_stored(twin.test.checkpoint, operator, partition, store)
            if batch == twin.test.run_ends[-1]:
                assert stored.latest_version() == batch + 1  # Spark's state version = batch id + 1
            table = stored.load(batch + 1)
            assert table.column_names[:4] == ["kg", "hash", "key", "value"]
            hashes = table.column("hash").to_numpy().astype(np.int64)
            kgs = table.column("kg").to_numpy().astype(np.int64)
            assert np.all(hashes % partitions == partition), (
                f"partition {partition} stores rows whose hash routes them elsewhere: "
                f"{sorted(set((hashes % partitions).tolist()))}")
            assert np.all(kgs == hashes % DEFAULT_MAX_PARALLELISM)
            assert table.column("value").null_count == 0
            assert table.num_rows == expected_counts.get(partition, 0), (
                f"batch {batch}, partition {partition}: stored {table.num_rows} rows, "
                f"Spark's reader of the HDFS run sees {expected_counts.get(partition, 0)}")
            total += table.num_rows
    assert total, "nothing stored; the scenario checks nothing"


@pytest.mark.parametrize("name,store", [
    ("window_agg_append", "default"),
    ("dedup_watermark", "default"),
    ("session_window", "default"),
    ("join_left_outer", "left-keyWithIndexToValue"),
    ("join_left_outer", "right-keyToNumValues"),
])
def test_watermark_eviction_removes_rows_from_storage(spark, scenario_run, tested_spark_state, name, store):
    twin = scenario_run(name)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))

    def stored_rows(version):
        return sum(open_stored(twin.test.checkpoint, 0, p, store).load(version).num_rows
                   for p in range(partitions))

    last = twin.test.run_ends[-1] + 1
    counts = [stored_rows(v) for v in range(1, last + 1)]
    assert counts[-1] < max(counts), f"stored rows per version {counts}: eviction removed nothing"
    # bounded: what is left is exactly what Spark still holds (HDFS run, same batch)
    expected = sum(_reader_counts(spark, twin.ref.checkpoint, last - 1, 0, store).values())
    assert counts[-1] == expected, f"stored rows per version {counts}; Spark's reader sees {expected}"
