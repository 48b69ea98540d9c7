"""Restores straight from S3 while tasks move between two executors (issue 38).

The checkpoint root is on the loopback S3 server (behind the fault proxy, which counts the executors'
requests, no faults), with a row image beside every snapshot and ``rowImages.rangeReads=true``. Every
batch's first attempt fails after its commit and is retried on the other executor, which holds none of
the store's files: it restores the version over the row image on S3, reading the image's index and the
blocks its keys need by range into its local cache. The totals stay exact, no row image is ever
downloaded whole, and a restart later restores every store from S3 again.
"""

from __future__ import annotations

import uuid

from tests.cluster.running_totals import RunningTotals
from tests.cluster.stores import PARTITIONS


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def test_tasks_moving_between_executors_restore_from_row_images_read_by_range_on_s3(cluster, cluster_s3, tmp_path):
    endpoint, proxy = cluster_s3
    bucket = f"moving-{uuid.uuid4().hex[:8]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    batches = 6
    q = RunningTotals(cluster, tmp_path, seed=38, fail_batches=range(1, batches), keys=200, rows=120,
                      options={"checkpoint_root": f"s3://{bucket}/state", "snapshot_interval": 1,
                               "row_images_min_rows": 0, "row_image_range_reads": True})
    before = proxy.stats()["imageGets"]
    q.add(batches)
    q.run()
    q.assert_exact()
    moved = [(b, p) for b in range(1, batches) for p in range(PARTITIONS) if len(set(q.ran_on(b, p))) == 2]
    assert moved, f"no task moved to the other executor; the test proved nothing: {q.attempts()}"
    q.add(2)
    q.run()   # a restart: every store restores from S3 again
    q.assert_exact()
    after = proxy.stats()["imageGets"]
    ranged, whole = after["range"] - before["range"], after["whole"] - before["whole"]
    loads = sum(op.get("customMetrics", {}).get("sparkStateImageLoads", 0)
                for p in q.query.progress for op in p.get("stateOperators", []))
    assert loads > 0, "no store was restored over a row image"
    assert ranged > 0, "no executor read a row image on S3 by range"
    assert whole == 0, f"{whole} GETs downloaded a whole row image; range reads fetch only byte ranges"
    s3_files = s3_client(endpoint).list_objects_v2(Bucket=bucket).get("KeyCount", 0)
    assert s3_files > 0 and not list((q.checkpoint / "state").rglob("*.img")), \
        "the row images must be on S3, not in the local checkpoint"
