"""A real query whose spark_state checkpoint root is on S3 (moto server on 127.0.0.1)."""

from __future__ import annotations

from collections import Counter

import fsspec

from tests.support.spark import JsonStream, Query


def test_running_counts_survive_restart_with_state_on_s3(spark, tmp_path, s3_bucket):
    events = JsonStream(tmp_path / "events", "k string")
    expected: Counter = Counter()
    query = Query(spark, lambda s: events.read(s).groupBy("k").count(), tmp_path / "ckpt",
                  options={"checkpoint_root": f"s3://{s3_bucket}/state", "snapshot_interval": 2},
                  conf={"spark.sql.streaming.stateStore.unloadOnCommit": "true"})
    for keys in ("aab", "bc", "cca", "d"):
        events.add([{"k": k} for k in keys])
        expected.update(keys)
        query.run()  # each run is a restart; every batch restores from S3
    latest: dict[str, int] = {}
    for batch in sorted(query.outputs):
        latest.update({row[0]: row[1] for row in query.outputs[batch]})
    assert latest == dict(expected)
    fs = fsspec.filesystem("s3")
    manifests = [p for p in fs.find(f"{s3_bucket}/state") if p.endswith("/_metadata")]
    assert manifests, "no manifest on S3"
    assert not list((tmp_path / "ckpt" / "state").rglob("*.arrow")), "state files must go to S3, not the local checkpoint"


def test_a_query_on_s3_restores_from_row_images_read_by_range_and_matches_hdfs(spark, tmp_path, s3_bucket):
    """Issue 38: every batch restores (unloadOnCommit) over the row image the worker wrote on S3 after the last
    commit, reading its index and the blocks its keys need by range through the executor's cache of remote
    images (rowImages.rangeReads=true); the output is the HDFS provider's, batch by batch, across
    restarts."""
    from pyspark.sql import functions as F

    from tests.support.spark import Twin

    events = JsonStream(tmp_path / "events", "k long")
    twin = Twin(spark, tmp_path, lambda s: events.read(s).groupBy((F.col("k") % 3000).alias("g")).count(),
                options={"checkpoint_root": f"s3://{s3_bucket}/state", "snapshot_interval": 1,
                         "row_images_min_rows": 0, "row_image_range_reads": True},
                conf={"spark.sql.streaming.stateStore.unloadOnCommit": "true"})
    engine = spark._jvm.io.sparkstate.shim.engine.Engine.executor()
    worker = spark._jvm.io.sparkstate.shim.worker
    options = getattr(worker.Options, "from")(spark._jvm.java.util.HashMap())
    before = list(engine.remoteFetches())
    for phase in range(4):
        events.add([{"k": k} for k in range(phase * 500, phase * 500 + 3000, 7)])
        events.add([{"k": k * 13} for k in range(200)])
        twin.run()   # a restart of each query; each batch restores its stores
        # the images of the versions just committed are written in the background by the suite's one worker,
        # after what earlier tests queued: wait for them, so the next restart finds them
        assert worker.WorkerClient.get().drain(options, 120_000) == 0
    twin.assert_same()
    fetched, requests = (a - b for a, b in zip(engine.remoteFetches(), before))
    assert requests > 0 and fetched > 0, "no restore read a row image on S3 by range"
    rows = [op.get("customMetrics", {}).get("sparkStateImageRows", 0)
            for p in twin.test.progress for op in p.get("stateOperators", [])]
    assert any(n > 0 for n in rows), "no batch looked keys up in a row image"
