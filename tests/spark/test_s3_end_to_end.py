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
