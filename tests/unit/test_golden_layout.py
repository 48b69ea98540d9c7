"""Golden bytes and paths: the on-disk contract, pinned before any code moves.

A store's directory (with and without ``checkpointRoot``, memory storage, named stores,
siblings of a rescaled chain), the manifest, compaction record and reference record bytes,
and the data-file bytes of both formats must stay exactly what earlier releases wrote and
read: checkpoints outlive the code that wrote them. Data-file bytes depend on Arrow's IPC
writer and its zstd, so they are compared byte for byte only with the pyarrow that wrote the
fixtures (recorded beside them); any pyarrow still decodes them to the same rows.

Regenerate the fixtures (only when a format change is intended):
``python -m tests.unit.test_golden_layout``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest

from spark_state.chain.references import Reference
from spark_state.format import datafile as snapshot, tables
from spark_state.format.manifest import CompactionRecord, FileEntry, ImageEntry, Manifest
from spark_state.options import Settings
from tests.support.paths import FIXTURES

GOLDEN = FIXTURES / "golden"
M = 64


# ----------------------------------------------------------------- store paths

def _ref(**kw):
    from spark_state.storage.layout import StoreRef

    base = dict(spark_root="file:/tmp/q/state", location="file:/tmp/q/state/0/3", operator=0, partition=3)
    base.update(kw)
    return StoreRef(**base)


ROOTS = [
    # (what, ref fields, settings, expected root)
    ("filesystem, Spark's directory", {}, {}, "file:///tmp/q/state/0/3"),
    ("filesystem, Spark's directory, query id", {"query_id": "q-1"}, {}, "file:///tmp/q/state/0/3"),
    ("named store", {"location": "file:/tmp/q/state/1/2/left-keyToNumValues", "operator": 1, "partition": 2,
                     "name": "left-keyToNumValues"}, {}, "file:///tmp/q/state/1/2/left-keyToNumValues"),
    ("s3", {"spark_root": "s3a://b/q/state", "location": "s3a://b/q/state/0/3"}, {}, "s3a://b/q/state/0/3"),
    ("memory, query id", {"query_id": "q-1"}, {"storage": "memory"}, "file:///tmp/q/state/0/3#q-1"),
    ("memory, no query id", {}, {"storage": "memory"}, "file:///tmp/q/state/0/3"),
    ("checkpointRoot, query id", {"query_id": "q-1"}, {"checkpoint_root": "file:///data/root/"},
     "file:///data/root/331c5c404dd7932f/0/3/default"),
    ("checkpointRoot, no query id", {}, {"checkpoint_root": "/data/root"},
     "file:///data/root/1b674902bfc80563/0/3/default"),
    ("checkpointRoot, named store", {"query_id": "q-1", "operator": 1, "partition": 2, "name": "right-keyWithIndexToValue",
                                     "location": "file:/tmp/q/state/1/2/right-keyWithIndexToValue"},
     {"checkpoint_root": "s3://bucket/root"}, "s3://bucket/root/331c5c404dd7932f/1/2/right-keyWithIndexToValue"),
]


@pytest.mark.parametrize("what, fields, options, expected", ROOTS, ids=[r[0] for r in ROOTS])
def test_store_roots_are_where_earlier_releases_put_them(what, fields, options, expected):
    from spark_state.storage.layout import resolve_root

    assert resolve_root(_ref(**fields), Settings(**options)) == expected


def test_checkpoint_digest_is_stable():
    from spark_state.storage.layout import checkpoint_digest

    assert checkpoint_digest("file:/tmp/q/state", "q-1") == "331c5c404dd7932f"
    assert checkpoint_digest("file:/tmp/q/state", None) == "1b674902bfc80563"


def test_siblings_of_a_rescaled_chain_are_spark_store_directories():
    assert _ref().sibling(7).location == "file:/tmp/q/state/0/7"
    assert _ref(name="left-keyToNumValues", location="file:/tmp/q/state/0/3/left-keyToNumValues").sibling(0).location \
        == "file:/tmp/q/state/0/0/left-keyToNumValues"
    assert _ref(spark_root="file:/tmp/q/state/").sibling(1).location == "file:/tmp/q/state/0/1"


@pytest.mark.parametrize("options", [{}, {"checkpoint_root": "file:///data/root"}], ids=["spark-dir", "checkpointRoot"])
@pytest.mark.parametrize("name", ["default", "left-keyToNumValues"])
def test_the_tools_find_a_store_where_the_worker_writes_it(tmp_path, options, name):
    """The offline tools derive a store's root from the checkpoint directory; the worker from what Spark sends."""
    from spark_state.spark.checkpoint import store_ref, store_root
    from spark_state.storage.layout import StoreId
    from spark_state.storage.directory import Dir
    from spark_state.storage.layout import resolve_root

    checkpoint = Dir(str(tmp_path / "ckpt"))
    sid = StoreId(2, 5, name)
    suffix = "" if name == "default" else f"/{name}"
    spark_sent = _ref(spark_root=f"file:{tmp_path}/ckpt/state", location=f"file:{tmp_path}/ckpt/state/2/5{suffix}",
                      operator=2, partition=5, name=name, query_id="q-9")
    settings = Settings(**options)
    assert store_ref(checkpoint, sid, "q-9").spark_root == spark_sent.spark_root
    assert store_root(checkpoint, sid, settings, "q-9") == resolve_root(spark_sent, settings)
    assert sid.rel == f"state/2/5{suffix}"


def test_data_file_names():
    from spark_state.storage.base import CheckpointStorage
    from spark_state.storage.layout import file_version, image_path, manifest_path, record_path

    path = CheckpointStorage.new_file_path(7, "delta")
    assert path.startswith("shared/v0000000007-delta-") and path.endswith(".arrow") and len(path) == len("shared/v0000000007-delta-") + 16 + len(".arrow")
    assert file_version(path) == 7
    assert manifest_path(12) == "chk-12/_metadata"
    assert record_path(12, "_snapshot") == "chk-12/_snapshot"
    snapshot = "shared/v0000000012-snapshot-0123456789abcdef.arrow"
    assert image_path(snapshot) == "shared/v0000000012-image-0123456789abcdef.img"
    assert file_version(image_path(snapshot)) == 12


# ----------------------------------------------------------------- records

def _entry(**kw) -> FileEntry:
    base = dict(path="shared/v0000000003-delta-00112233445566aa.arrow", kind="delta", version=3, size=1234,
                checksum="crc32:0badf00d", rows=10, index_offset=1000, index_length=200, index_checksum="crc32:12345678")
    base.update(kw)
    return FileEntry(**base)


def _records() -> dict[str, bytes]:
    """Every record kind, with every optional field both absent and present."""
    snap = _entry(path="shared/v0000000001-snapshot-aabbccddeeff0011.arrow", kind="snapshot", version=1)
    return {
        "manifest-format2.json": Manifest(3, M, (snap, _entry()), None, commit_id="c0ffee0000000001",
                                          query_id="q-1", created_ms=1_700_000_000_000).to_json(),
        "manifest-format2-snapshot-only.json": Manifest(1, M, (snap,), 42, commit_id="c0ffee0000000002",
                                                        created_ms=1_700_000_000_001).to_json(),
        "manifest-format3-slices.json": Manifest(5, M, (_entry(partition=1, modulus=4, residue=3), _entry(version=5)),
                                                 None, commit_id="c0ffee0000000003", query_id="q-2",
                                                 created_ms=1_700_000_000_002).to_json(),
        "manifest-format4-typed.json": Manifest(4, M, (_entry(file_format=2), _entry(file_format=2, partition=0)),
                                                None, commit_id="c0ffee0000000004", query_id="q-3",
                                                created_ms=1_700_000_000_003).to_json(),
        "manifest-format5-imaged.json": Manifest(
            12, M, (_entry(kind="snapshot", file_format=2, image=ImageEntry(
                "shared/v0000000012-image-0123456789abcdef.img", 4096, "crc32:00c0ffee", 10)), _entry(file_format=2)),
            None, commit_id="c0ffee0000000005", query_id="q-4", created_ms=1_700_000_000_006).to_json(),
        "compaction-record.json": CompactionRecord(3, "c0ffee0000000001", snap,
                                                   created_ms=1_700_000_000_004).to_json(),
        "compaction-record-typed.json": CompactionRecord(4, "c0ffee0000000004", _entry(file_format=2, kind="snapshot"),
                                                         created_ms=1_700_000_000_005).to_json(),
        "reference.json": Reference(2, 6, ("shared/a.arrow", "shared/b.arrow")).to_json(),
    }


@pytest.mark.parametrize("name", sorted(_records()))
def test_record_bytes_are_unchanged(name):
    assert _records()[name] == (GOLDEN / name).read_bytes()


def test_reference_records_read_back_with_or_without_their_checksum():
    """reference-unsigned.json: the record as releases before its checksum wrote it (issue 27)."""
    expected = Reference(2, 6, ("shared/a.arrow", "shared/b.arrow"))
    for name in ("reference.json", "reference-unsigned.json"):
        assert Reference.from_json((GOLDEN / name).read_bytes(), name) == expected


@pytest.mark.parametrize("name", [n for n in sorted(_records()) if n.startswith("manifest")])
def test_records_read_back(name):
    data = (GOLDEN / name).read_bytes()
    assert Manifest.from_json(data, name).to_json() == data


# ----------------------------------------------------------------- data files

def _opaque_rows() -> pa.Table:
    keys = [b"k%03d" % i for i in range(300)]
    hashes = np.array([int.from_bytes(hashlib.sha1(k).digest()[:4], "little", signed=True) for k in keys], np.int32)
    values = [None if i % 17 == 0 else b"v" * (i % 23) for i in range(300)]
    return pa.table({"kg": pa.array(np.mod(hashes, M).astype(np.int32)), "hash": pa.array(hashes),
                     "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())},
                    schema=tables.CHANGES_SCHEMA)


def _typed_rows() -> pa.Table:
    n = 300
    ids = np.arange(n, dtype=np.int64)
    hashes = ((ids * 2654435761) % (2**32) - 2**31).astype(np.int32)
    key = pa.StructArray.from_arrays([pa.array(ids), pa.array([f"user-{i % 7}" for i in range(n)])], ["id", "name"])
    value = pa.StructArray.from_arrays(
        [pa.array(ids * 3), pa.array(ids / 7.0), pa.array([f"city-{i % 5}" for i in range(n)])],
        ["count", "avg", "city"], mask=pa.array([i % 13 == 0 for i in range(n)]))
    return pa.table({"kg": pa.array(np.mod(hashes, M).astype(np.int32)), "hash": pa.array(hashes),
                     "key": key, "value": value})


def _data_files() -> dict[str, tuple[pa.Table, snapshot.EncodedFile]]:
    opaque, typed = _opaque_rows(), _typed_rows()
    live = lambda t: t.filter(t.column("value").is_valid())  # noqa: E731 - a snapshot holds no deletes
    return {
        "opaque-snapshot.arrow": (live(opaque), snapshot.encode(live(opaque), 3, target_batch_bytes=2048)),
        "opaque-delta.arrow": (opaque, snapshot.encode(opaque, -3, target_batch_bytes=2048)),
        "typed-snapshot.arrow": (live(typed), snapshot.encode(live(typed), 3, target_batch_bytes=2048)),
        "typed-delta.arrow": (typed, snapshot.encode(typed, -3, arrival_order=True, target_batch_bytes=2048)),
    }


def _pyarrow_that_wrote() -> str:
    return json.loads((GOLDEN / "data-files.json").read_text())["pyarrow"]


@pytest.mark.parametrize("name", sorted(_data_files()))
def test_data_file_bytes_are_unchanged(name):
    rows, encoded = _data_files()[name]
    recorded = json.loads((GOLDEN / "data-files.json").read_text())["files"][name]
    golden = (GOLDEN / name).read_bytes()
    if pa.__version__ == _pyarrow_that_wrote():
        assert encoded.data == golden
    assert {k: getattr(encoded, k) for k in recorded} == recorded
    decoded = snapshot.decode(golden, name, M)
    if "typed-delta" in name:   # arrival order
        assert decoded.column("hash").equals(rows.column("hash"))
    else:
        assert (np.diff(decoded.column("kg").to_numpy()) >= 0).all()
    assert _sorted_rows(decoded) == _sorted_rows(rows)


def _sorted_rows(table: pa.Table) -> list:
    return sorted((r["kg"], r["hash"], repr(r["key"]), repr(r["value"])) for r in table.to_pylist())


def _regenerate() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, data in _records().items():
        (GOLDEN / name).write_bytes(data)
    meta = {"pyarrow": pa.__version__, "files": {}}
    for name, (_, encoded) in _data_files().items():
        (GOLDEN / name).write_bytes(encoded.data)
        meta["files"][name] = {k: getattr(encoded, k) for k in
                               ("rows", "checksum", "index_offset", "index_length", "index_checksum", "file_format")}
    (GOLDEN / "data-files.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    _regenerate()
