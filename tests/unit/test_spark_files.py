"""Spark's own checkpoint files as the lifecycle tools read and rewrite them (spark_state.spark.files): files
Spark 4.3 wrote (tests/fixtures/format1) parse, a rewrite keeps every line it does not change byte for byte,
and anything else is a CheckpointError that says what is wrong."""

from __future__ import annotations

import json

import pytest

from spark_state.errors import CheckpointError
from spark_state.spark.files import (
    SHUFFLE_PARTITIONS, OffsetSeq, OperatorMetadata, batch_of, parse_commit, parse_query_id, query_metadata,
)
from tests.support.paths import FIXTURES

#: A checkpoint Spark 4.3 wrote (an aggregation, 3 batches, 2 partitions).
SPARK_WRITTEN = FIXTURES / "format1" / "agg" / "ckpt-test"


@pytest.mark.parametrize("name,batch", [("0", 0), ("17", 17), ("9.compact", 9), (".17.crc", None),
                                        ("17.tmp", None), ("x", None), ("", None), ("-1", None)])
def test_batch_of_reads_log_file_names_only(name, batch):
    assert batch_of(name) == batch


def test_an_offset_log_entry_spark_wrote_parses_and_writes_back_byte_for_byte():
    data = (SPARK_WRITTEN / "offsets" / "1").read_bytes()
    entry = OffsetSeq.parse(data, "offsets/1")
    assert entry.version == 1
    assert entry.conf[SHUFFLE_PARTITIONS] == "2"
    assert entry.metadata["batchWatermarkMs"] == 0
    assert entry.source_offset(0) == {"logOffset": 1}
    assert entry.source_offset(1) is None
    assert entry.to_bytes() == data


def test_a_conf_change_rewrites_only_the_metadata_line():
    data = (SPARK_WRITTEN / "offsets" / "2").read_bytes()
    entry = OffsetSeq.parse(data, "offsets/2")
    changed = OffsetSeq.parse(entry.with_conf({SHUFFLE_PARTITIONS: "6"}).to_bytes(), "offsets/2")
    assert changed.conf == {**entry.conf, SHUFFLE_PARTITIONS: "6"}
    assert changed.offsets == entry.offsets
    assert {k: v for k, v in changed.metadata.items() if k != "conf"} == \
           {k: v for k, v in entry.metadata.items() if k != "conf"}
    assert entry.conf[SHUFFLE_PARTITIONS] == "2", "the parsed entry is not changed in place"


def test_offsets_without_metadata_or_source_offset_are_read_as_absent():
    entry = OffsetSeq.parse(b"v1\n\n-\nnot json\n[1]", "offsets/0")
    assert entry.metadata is None and entry.conf == {}
    assert [entry.source_offset(i) for i in range(4)] == [None, None, None, None]
    with pytest.raises(CheckpointError, match="no metadata"):
        entry.with_conf({SHUFFLE_PARTITIONS: "4"})


def test_v2_offsets_are_read_but_have_no_positional_source_offsets():
    entry = OffsetSeq.parse(b'v2\n{"conf":{"spark.sql.shuffle.partitions":"3"}}\n0:{"logOffset":4}', "offsets/5")
    assert entry.version == 2 and entry.conf[SHUFFLE_PARTITIONS] == "3"
    assert entry.source_offset(0) is None


def test_a_commit_log_entry_spark_wrote_parses():
    assert parse_commit((SPARK_WRITTEN / "commits" / "1").read_bytes(), "commits/1") == {"nextBatchWatermarkMs": 0}
    assert parse_commit(b"v1", "commits/3") == {}
    assert parse_commit(b"v1\n", "commits/3") == {}


def test_the_query_id_spark_wrote_parses_and_writes_back_the_same():
    data = (SPARK_WRITTEN / "metadata").read_bytes()
    query_id = parse_query_id(data, "metadata")
    assert query_id == json.loads(data)["id"]
    assert parse_query_id(query_metadata(query_id), "metadata") == query_id
    assert parse_query_id(b'{"id":\n"abc"}\n', "metadata") == "abc", "a file split over lines is one JSON object"


def test_operator_metadata_spark_wrote_parses_and_a_rescale_changes_only_the_partitions():
    data = (SPARK_WRITTEN / "state" / "0" / "_metadata" / "metadata").read_bytes()
    meta = OperatorMetadata.parse(data, "state/0/_metadata/metadata")
    assert (meta.operator, meta.name, meta.stores, meta.num_partitions) == (0, "stateStoreSave", ("default",), 2)
    rescaled = OperatorMetadata.parse(meta.with_partitions(6), "m")
    assert (rescaled.operator, rescaled.name, rescaled.stores, rescaled.num_partitions) == (0, "stateStoreSave",
                                                                                            ("default",), 6)
    assert json.loads(meta.with_partitions(2).split(b"\n", 1)[1]) == json.loads(data.split(b"\n", 1)[1])


def test_stores_with_different_partition_counts_have_no_single_count():
    body = {"operatorInfo": {"operatorId": 1, "operatorName": "symmetricHashJoin"},
            "stateStoreInfo": [{"storeName": "left", "numPartitions": 2}, {"storeName": "right", "numPartitions": 3}]}
    meta = OperatorMetadata.parse(("v1\n" + json.dumps(body)).encode(), "m")
    assert meta.stores == ("left", "right") and meta.num_partitions is None


@pytest.mark.parametrize("data,message", [
    (b"\xff\xfe v1", "not UTF-8"),
    (b"", "version line"),
    (b'{"batchWatermarkMs":0}', "version line"),
    (b"v3\n{}", "log format v3"),
    (b"v1\n{not json", "not JSON"),
    (b"v1\n[1, 2]", "not an object"),
])
def test_bad_offset_files_are_clear_errors(data, message):
    with pytest.raises(CheckpointError, match=message) as err:
        OffsetSeq.parse(data, "offsets/7")
    assert "offsets/7" in str(err.value) or message == "log format v3"


def test_an_offset_file_cut_after_its_version_line_is_truncated():
    with pytest.raises(CheckpointError, match="truncated"):
        OffsetSeq.parse(b"v1", "offsets/7")


@pytest.mark.parametrize("data,message", [(b"v3\n{}", "log format v3"), (b"x\n{}", "version line"),
                                          (b"v1\n{", "not JSON")])
def test_bad_commit_files_are_clear_errors(data, message):
    with pytest.raises(CheckpointError, match=message):
        parse_commit(data, "commits/2")


@pytest.mark.parametrize("data,message", [(b"{}", "no query id"), (b'{"id": ""}', "no query id"),
                                          (b'{"id": 7}', "no query id"), (b"[]", "not an object"),
                                          (b"", "not JSON")])
def test_bad_query_metadata_is_a_clear_error(data, message):
    with pytest.raises(CheckpointError, match=message):
        parse_query_id(data, "metadata")


@pytest.mark.parametrize("data", [b"v1\n{}", b'v1\n{"operatorInfo": {"operatorId": "x"}, "stateStoreInfo": []}',
                                  b'v1\n{"operatorInfo": {"operatorId": 0, "operatorName": "a"}, '
                                  b'"stateStoreInfo": [{"storeName": "default"}]}'])
def test_operator_metadata_of_another_shape_is_a_clear_error(data):
    with pytest.raises(CheckpointError, match="not operator metadata Spark 4.3 wrote"):
        OperatorMetadata.parse(data, "state/0/_metadata/metadata")
