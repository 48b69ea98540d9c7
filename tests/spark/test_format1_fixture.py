"""Checkpoints written in file format 1 (opaque UnsafeRow bytes, tests/fixtures/format1, made by the
spark_state before typed files) keep loading: restarted with the current code they give the HDFS
provider's output, and their first commit rewrites every store as a typed snapshot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import spark_state
from spark_state.errors import CheckpointError
from spark_state.format.manifest import SNAPSHOT
from spark_state.spark.checkpoint import SparkCheckpoint
from tests.fixtures.format1_queries import QUERIES
from tests.support.paths import FIXTURES
from tests.support.spark import JsonStream, Twin, arrow_rows, sort_rows

FIXTURE = FIXTURES / "format1"


def _chains(checkpoint: Path, batch: int):
    ckpt = SparkCheckpoint(str(checkpoint))
    return [ckpt.manifest(sid, batch + 1).files for sid in ckpt.stores(batch)]


def _statestore(spark, checkpoint: Path, batch: int):
    return sort_rows(spark.read.format("statestore").option("batchId", batch).load(str(checkpoint))
                     .select("partition_id", "key", "value").collect())


@pytest.mark.parametrize("name", list(QUERIES))
def test_format1_checkpoint_restarts_with_hdfs_output_and_becomes_typed(spark, tested, tmp_path, name):
    if tested != "spark_state":
        pytest.skip("the fixture is a spark_state checkpoint")
    query = QUERIES[name]
    work = tmp_path / name
    shutil.copytree(FIXTURE / name, work)
    # Spark plans the last batch again on restart: its source log must name files under the input directory.
    for log in work.glob("ckpt-*/sources/0/*"):
        log.write_text(log.read_text().replace(f"file:///format1-fixture/{name}/input/", f"file://{work}/input/"))
    events = JsonStream(work / "input", query.schema)
    events.files = len(query.phases[0])   # new file names, after those the source log has seen
    twin = Twin(spark, work, query.builder(events), mode=query.mode, conf=query.conf)
    before = twin.test.last_batch()
    assert all(not f.typed for chain in _chains(twin.test.checkpoint, before) for f in chain), \
        "the fixture must hold format-1 files"
    with pytest.raises(CheckpointError, match="file format 1"):
        spark_state.read_state(str(twin.test.checkpoint))

    for rows in query.phases[1]:
        events.add(rows)
    twin.run()
    twin.assert_same()
    assert twin.test.outputs and min(twin.test.outputs) == before + 1

    after = twin.test.last_batch()
    for chain in _chains(twin.test.checkpoint, before + 1):   # the first commit after the restart
        assert chain[0].kind == SNAPSHOT and all(f.typed for f in chain)
    for batch in (before + 1, after):
        expected = _statestore(spark, twin.test.checkpoint, batch)
        assert expected == _statestore(spark, twin.ref.checkpoint, batch)
        assert arrow_rows(spark_state.read_state(str(twin.test.checkpoint), batch=batch)) == expected


def test_an_executor_writing_format_1_on_typed_state_ships_it_whole_once(spark, tested, tmp_path):
    """Executors may disagree on the format (an executor started with -Dspark_state.opaqueRows=true, or a
    schema one Spark version maps and another does not): a provider without the typed codec, on a typed
    version, ships its whole map once as an opaque snapshot; the output stays the HDFS provider's."""
    if tested != "spark_state":
        pytest.skip("the fixture is a spark_state checkpoint")
    query = QUERIES["agg"]
    work = tmp_path / "agg"
    shutil.copytree(FIXTURE / "agg", work)
    for log in work.glob("ckpt-*/sources/0/*"):
        log.write_text(log.read_text().replace("file:///format1-fixture/agg/input/", f"file://{work}/input/"))
    events = JsonStream(work / "input", query.schema)
    events.files = len(query.phases[0])
    twin = Twin(spark, work, query.builder(events), mode=query.mode, conf=query.conf)
    for rows in query.phases[1]:
        events.add(rows)
    twin.run()   # typed from here on
    typed_at = twin.test.last_batch()
    assert all(f.typed for chain in _chains(twin.test.checkpoint, typed_at) for f in chain)

    system = spark._jvm.java.lang.System
    system.setProperty("spark_state.opaqueRows", "true")   # local[2]: the executors are this JVM
    try:
        for rows in query.phases[1]:
            events.add(rows)
        twin.run()
    finally:
        system.clearProperty("spark_state.opaqueRows")
    twin.assert_same()
    last = twin.test.last_batch()
    assert last > typed_at
    for chain in _chains(twin.test.checkpoint, typed_at + 1):
        assert chain[0].kind == SNAPSHOT and not any(f.typed for f in chain)
    assert _statestore(spark, twin.test.checkpoint, last) == _statestore(spark, twin.ref.checkpoint, last)
