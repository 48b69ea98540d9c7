"""FileSystemCheckpointStorage against a real S3 endpoint (moto server on 127.0.0.1)."""

from __future__ import annotations

import uuid

import fsspec
import pyarrow as pa
import pytest

from spark_state.chain import forget_stores, open_store
from spark_state.errors import ChecksumMismatch, VersionNotFound
from spark_state.options import Settings
from spark_state.storage.layout import StoreRef
from tests.support import s3_server
from tests.support.changes import as_dict, changes_table


@pytest.fixture(scope="module")
def bucket():
    s3_server.start()
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(name)
    return name


def _changes(puts: dict[int, bytes | None]) -> pa.Table:
    """Changes of the keys ``k.to_bytes(4)``, each hashed to ``k`` (the default max parallelism)."""
    keys = sorted(puts)
    return changes_table(keys, [k.to_bytes(4, "big") for k in keys], [puts[k] for k in keys])


def _store(bucket: str, snapshot_interval: int = 2):
    ref = StoreRef(spark_root="file:/tmp/q/state", location="file:/tmp/q/state/0/0", operator=0, partition=0)
    settings = Settings(checkpoint_root=f"s3://{bucket}/state", snapshot_interval=snapshot_interval)
    return open_store(ref, settings)


def test_versions_compaction_and_retention_on_s3(bucket):
    store = _store(bucket)
    model: dict[bytes, bytes] = {}
    for version in range(1, 8):
        puts = {k: f"v{version}-{k}".encode() for k in range(version, version + 20)}
        puts[version - 1] = None  # one delete per version
        store.commit(version, _changes(puts))
        for k, v in puts.items():
            if v is None:
                model.pop(k.to_bytes(4, "big"), None)
            else:
                model[k.to_bytes(4, "big")] = v
        store.maintenance(min_versions_to_retain=3)
    assert as_dict(store.load(7)) == model
    assert store.versions()[-3:] == [5, 6, 7]
    with pytest.raises(VersionNotFound):
        store.load(1)  # retained away
    forget_stores()  # a new process: nothing cached, everything from S3
    assert as_dict(_store(bucket).load(7)) == model
    fs = fsspec.filesystem("s3")
    assert fs.ls(f"{bucket}/state"), "files must be on the S3 endpoint"


def test_corrupted_object_on_s3_is_named(bucket):
    store = _store(bucket)
    forget_stores()
    store = _store(bucket)
    latest = store.latest_version()
    fs = fsspec.filesystem("s3")
    files = [p for p in fs.find(f"{bucket}/state") if p.endswith(".arrow")]
    victim = max(files)
    data = bytearray(fs.cat_file(victim))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(victim, bytes(data))
    forget_stores()
    with pytest.raises(ChecksumMismatch) as err:
        _store(bucket).load(latest)
    assert victim.rsplit("/", 1)[-1] in str(err.value)
