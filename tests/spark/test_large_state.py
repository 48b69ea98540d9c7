"""State larger than memory, restored without rebuilding it (issue 23), on real queries.

Between the phases of each query every store of the checkpoint is compacted offline with row images
(``rowImages.minRows=0``), and ``unloadOnCommit`` makes Spark drop its providers after every commit,
so every batch of the second phase restores its state lazily: the shim opens the snapshot's row image
and looks keys up in it, and only the changes after the snapshot are decoded. A tiny ``memoryLimit``
makes the stores spill their changed rows to local row images at every commit. The output must be
the HDFS provider's, batch by batch, for every operator (session windows' prefix scans included).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.support.scenarios import SCENARIOS, TIMEOUTS, run_scenario
from tests.support.spark import JsonStream, Query, QueryFailed
from tests.support.stores import open_stored, store_root

pytestmark = pytest.mark.spark_state_only("row images and spills are spark_state's")

IMAGES = {"row_images_min_rows": 0}
RESTORE_EVERY_BATCH = {"spark.sql.streaming.stateStore.unloadOnCommit": "true"}
#: Every kind of store: aggregations, eviction by watermark (full scans), a join's four stores (puts and
#: removes while it scans), applyInPandasWithState, session windows (prefix scans).
LAYERED = ["agg_update", "window_agg_append", "dedup_watermark", "join_inner", "apply_in_pandas_then_window_agg",
           "session_window"]


def compact_with_images(checkpoint: Path, stores: dict) -> int:
    """Compacts every store of a stopped query's checkpoint into a snapshot with its row image, as the
    worker's background maintenance does; returns how many images there are."""
    images = 0
    for operator, names in stores.items():
        for partition_dir in sorted((Path(checkpoint) / "state" / str(operator)).iterdir()):
            if not partition_dir.name.isdigit():
                continue
            for name in names:
                partition = int(partition_dir.name)
                if not store_root(checkpoint, operator, partition, name).exists():
                    continue
                store = open_stored(checkpoint, operator, partition, name, row_images_min_rows=0,
                                    snapshot_interval=1)
                latest = store.latest_version()
                if latest:
                    store.maintenance(100, latest)
                    images += sum(1 for p in store.storage.list_files() if p.endswith(".img"))
    return images


def image_rows(query: Query) -> list[int]:
    """sparkStateImageRows of each batch's first stateful operator: rows looked up in row images."""
    return [op.get("customMetrics", {}).get("sparkStateImageRows", 0)
            for p in query.progress for op in p.get("stateOperators", [])[:1]]


@pytest.mark.parametrize("name", LAYERED)
def test_lazy_restores_from_row_images_give_hdfs_output(spark, tmp_path, name):
    scenario = SCENARIOS[name]
    made = []

    def between(twin):
        made.append(compact_with_images(twin.test.checkpoint, scenario.stores))

    twin = run_scenario(spark, tmp_path, scenario, tested="spark_state", options=IMAGES,
                        conf=RESTORE_EVERY_BATCH, between=between)
    twin.assert_same()
    assert made and made[0] > 0, "no row image was written: the restores were not lazy"
    assert any(n > 0 for n in image_rows(twin.test)), "no batch looked keys up in a row image"


@pytest.mark.parametrize("name", ["agg_update", "dedup", "dedup_watermark", "dedup_within_watermark", "join_inner",
                                  "session_window", "apply_in_pandas_then_window_agg", "apply_in_pandas_timeouts"])
def test_stores_over_their_memory_limit_spill_and_give_hdfs_output(spark, tmp_path, name):
    """memoryLimit of 1 KiB: every commit spills the changed rows to sorted runs on local disk (merged in the
    background), so the second phase reads, scans and prefix-scans rows that live only in runs; applyInPandasWithState's
    event-time timeouts walk the whole store and remove the rows of the keys that timed out."""
    scenario = TIMEOUTS if name == TIMEOUTS.name else SCENARIOS[name]
    twin = run_scenario(spark, tmp_path, scenario, tested="spark_state", options={**IMAGES, "memory_limit": "1k"})
    twin.assert_same()
    assert any(n > 0 for n in image_rows(twin.test)), "no store spilled its rows to a row image"
    if name == "apply_in_pandas_timeouts":
        assert any(row[3] == "timeout" for row in twin.ref.rows()), "no key timed out; the scenario proves nothing"


def counts_with_images(spark, tmp_path):
    """A running count restored every batch, run once and compacted offline with row images: its input
    stream, the query and the images (paths) the restart will meet."""
    events = JsonStream(tmp_path / "events", "k string, n int")
    query = Query(spark, lambda s: events.read(s).groupBy("k").count(), tmp_path / "ckpt",
                  options=IMAGES, conf=RESTORE_EVERY_BATCH)
    events.add([{"k": k, "n": 1} for k in "aabbbc"])
    query.run()
    assert compact_with_images(query.checkpoint, {0: ["default"]}) > 0
    return events, query, list((tmp_path / "ckpt" / "state").rglob("*.img"))


def custom(query: Query, metric: str, start: int = 0) -> int:
    """A custom metric of the first stateful operator, summed over the batches from the ``start``-th on."""
    return sum(op.get("customMetrics", {}).get(metric, 0)
               for p in query.progress[start:] for op in p.get("stateOperators", [])[:1])


def test_progress_says_where_loads_came_from_and_what_they_read(spark, tmp_path):
    """sparkStateImageLoads counts the stores that restored from their row image (on a local disk: nothing
    read from storage to open it); with the images gone, the restores decode the rows, and sparkStateBytesRead
    shows the chain's files they read."""
    events, query, images = counts_with_images(spark, tmp_path / "lazy")
    first = len(query.progress)
    events.add([{"k": k, "n": 1} for k in "abd"])
    query.run()
    assert custom(query, "sparkStateImageLoads", first) == len(images), query.progress[first:]
    assert custom(query, "sparkStateBytesRead", first) == 0, "a local image is opened in place"
    events, query, images = counts_with_images(spark, tmp_path / "whole")
    for image in images:
        image.unlink()
    first = len(query.progress)
    events.add([{"k": k, "n": 1} for k in "abd"])
    query.run()
    assert sorted(query.outputs[1]) == [("a", 3), ("b", 4), ("d", 1)]
    assert custom(query, "sparkStateImageLoads", first) == 0
    assert custom(query, "sparkStateBytesRead", first) > 0 and custom(query, "sparkStateRowsLoaded", first) > 0


def test_a_vanished_row_image_costs_only_the_laziness(spark, tmp_path):
    """The snapshot's image deleted under the checkpoint (a disk cleaner): the restore loads the rows."""
    events, query, images = counts_with_images(spark, tmp_path)
    for image in images:
        image.unlink()
    events.add([{"k": k, "n": 1} for k in "abd"])
    query.run()
    assert sorted(query.outputs[1]) == [("a", 3), ("b", 4), ("d", 1)]


def test_a_corrupt_row_image_fails_no_batch_and_loses_nothing(spark, tmp_path):
    """Every block of the image flipped: opening checks the index, reading a block its CRC; either way
    the store loads the snapshot's rows instead, and the counts carry on exactly."""
    events, query, images = counts_with_images(spark, tmp_path)
    for image in images:
        data = bytearray(image.read_bytes())
        for i in range(0, len(data) - 40, 7):
            data[i] ^= 0x5A
        image.write_bytes(bytes(data))
    events.add([{"k": k, "n": 1} for k in "abd"])
    query.run()
    assert sorted(query.outputs[1]) == [("a", 3), ("b", 4), ("d", 1)]


def test_a_damaged_block_found_by_a_lookup_fails_the_batch_clearly_and_the_rerun_loads_the_rows(spark, tmp_path):
    """A block damaged where only its CRC-32 can tell (the index intact, so the image opens): the first
    lookup of a key in it fails the task with an error naming the file; Spark's retry on this executor
    (or a restart of the query) loads the snapshot's rows instead, and nothing is lost."""
    events, query, images = counts_with_images(spark, tmp_path)
    for image in images:
        data = bytearray(image.read_bytes())
        data[3] ^= 0xFF   # inside block 0 (blocks start the file; the index and trailer end it)
        image.write_bytes(bytes(data))
    events.add([{"k": k, "n": 1} for k in "abcd"])
    # Every partition's image is damaged, and local mode aborts the job at the first failed task (the other
    # task may be cancelled before its lookup): each run finds at least one more, so at most one per image fails.
    for _ in images:
        try:
            query.run()
            break
        except QueryFailed as err:
            assert "corrupt" in err.message and ".img" in err.message, err.message
    else:
        query.run()
    assert sorted(query.outputs[1]) == [("a", 3), ("b", 4), ("c", 2), ("d", 1)]


def test_a_damaged_image_turns_images_off_for_its_own_store_only(spark, tmp_path):
    """The executor remembers the stores whose image was damaged (their later loads read rows), by the store's
    whole identity: another query's stores with the same operator and partitions (in another checkpoint)
    still restore from their images. (Keyed by StateStoreId.toString(), which leaves out the checkpoint, one
    damaged image turned images off for every later query of the JVM, e.g. the S3 range-read test's.)"""
    events, query, images = counts_with_images(spark, tmp_path / "damaged")
    for image in images:
        data = bytearray(image.read_bytes())
        data[3] ^= 0xFF
        image.write_bytes(bytes(data))
    events.add([{"k": k, "n": 1} for k in "ab"])
    failed = 0
    for _ in range(len(images) + 1):
        try:
            query.run()
            break
        except QueryFailed as err:
            assert "corrupt" in err.message, err.message
            failed += 1
    assert failed > 0, "no lookup met the damaged block: the executor marked no store"
    assert sorted(query.outputs[1]) == [("a", 3), ("b", 4)]

    events, query, images = counts_with_images(spark, tmp_path / "intact")
    first = len(query.progress)
    events.add([{"k": k, "n": 1} for k in "abd"])
    query.run()
    assert sorted(query.outputs[1]) == [("a", 3), ("b", 4), ("d", 1)]
    assert custom(query, "sparkStateImageLoads", first) == len(images), query.progress[first:]


# ------------------------------------------------------------------ damaged spill runs

def spill_runs(pid: int) -> dict[str, str]:
    """The spill runs a JVM holds open, /proc/<pid>/fd/N -> the file's path: runs are unlinked once open (read
    through their descriptors), yet whoever may open the process's descriptors can still write them."""
    runs = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "/spill/state-" in target and target.endswith(" (deleted)"):
            runs[str(fd)] = target[:-len(" (deleted)")]
    return runs


def flip_blocks(fd: str) -> None:
    """XORs every byte of a run's blocks, leaving its index and trailer whole (it opened; only the CRC-32 of a
    block read tells)."""
    with open(fd, "r+b") as f:
        f.seek(-40, os.SEEK_END)
        (blocks_end,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        blocks = bytearray(f.read(blocks_end))
        for i in range(len(blocks)):
            blocks[i] ^= 0x5A
        f.seek(0)
        f.write(blocks)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_a_damaged_spill_run_fails_the_batch_clearly_and_the_rerun_reloads_exact_state(spark, tmp_path):
    """A running count under memoryLimit=1k: batch 0's commit spills each store's rows to a run on local disk.
    Right after it (the query still running, its stores holding their runs), every block of those runs is damaged
    through the executor's descriptors. Batch 1 looks up keys that live only there: it fails, with an error naming
    the damaged file, never with a wrong count; the query restarted re-runs it from the checkpoint, exact."""
    events = JsonStream(tmp_path / "events", "k string, n int")
    query = Query(spark, lambda s: events.read(s).groupBy("k").count(), tmp_path / "ckpt",
                  options={"memory_limit": "1k"})
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    before = set(spill_runs(pid).values())
    damaged: list[str] = []

    def damage(batch: int) -> None:
        if batch == 0 and not damaged:
            for fd, path in spill_runs(pid).items():
                if path not in before:
                    flip_blocks(fd)
                    damaged.append(path)

    query.on_batch = damage
    events.add([{"k": k, "n": 1} for k in "aabbbc"])
    events.add([{"k": k, "n": 1} for k in "abd"])
    with pytest.raises(QueryFailed) as failed:
        query.run()
    assert damaged, "batch 0 left no spill run open: nothing was damaged"
    # runs live in the executor's own folder directly under a local dir Spark is configured with, where the next
    # executor on the host finds it if this one is killed (not in Spark's per-JVM spark-<uuid> folder)
    local_dirs = {str(Path(d)) for d in spark._jvm.org.apache.spark.util.Utils.getConfiguredLocalDirs(
        spark.sparkContext._jsc.sc().getConf())}
    folders = {Path(p).parent.parent for p in damaged}
    assert all(f.name.startswith("spark-state-local-") and str(f.parent) in local_dirs for f in folders), \
        (folders, local_dirs)
    message = failed.value.message
    assert "corrupt" in message and any(Path(p).name in message for p in damaged), message
    assert 1 not in query.outputs, "batch 1 gave an output over damaged runs"
    query.run()
    assert query.outputs[0] == [("a", 2), ("b", 3), ("c", 1)]
    assert query.outputs[1] == [("a", 3), ("b", 4), ("d", 1)]
