"""A real query whose spark_state checkpoint root is on S3 (moto server on 127.0.0.1)."""

from __future__ import annotations

import uuid
from collections import Counter

import fsspec
import pytest

from tests.support import s3_server
from tests.support.spark import JsonStream, Query


@pytest.fixture
def bucket(tested):
    if tested != "spark_state":
        pytest.skip("spark_state's checkpointRoot")
    s3_server.start()
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(name)
    return name


def test_running_counts_survive_restart_with_state_on_s3(spark, tmp_path, bucket):
    events = JsonStream(tmp_path / "events", "k string")
    expected: Counter = Counter()
    query = Query(spark, lambda s: events.read(s).groupBy("k").count(), tmp_path / "ckpt",
                  options={"checkpoint_root": f"s3://{bucket}/state", "snapshot_interval": 2},
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
    manifests = [p for p in fs.find(f"{bucket}/state") if p.endswith("/_metadata")]
    assert manifests, "no manifest on S3"
    assert not list((tmp_path / "ckpt" / "state").rglob("*.arrow")), "state files must go to S3, not the local checkpoint"
