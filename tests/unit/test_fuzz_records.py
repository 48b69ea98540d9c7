"""Fuzzed records and row images: every reader of a small file from storage (manifest, compaction record,
reference record, savepoint ``_metadata``, Spark's offset and commit logs, ``metadata`` and operator
metadata as the tools read them, a row image) answers damaged bytes with a named spark_state error or,
where the record carries a checksum, exactly what was written; never another exception or a large
allocation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_state.chain.references import Reference
from spark_state.errors import ChecksumMismatch, SparkStateError
from spark_state.format import datafile, rowimage
from spark_state.format.manifest import CompactionRecord, FileEntry, ImageEntry, Manifest
from spark_state.lifecycle.savepoint import SavepointFile, SavepointMetadata
from spark_state.spark.files import OffsetSeq, OperatorMetadata, parse_commit, parse_query_id
from tests.support.changes import opaque_changes
from tests.support.fuzzing import flips, fuzz_settings, mutations, numbers_near_end, read_damaged

M = 64
_enc = datafile.encode(opaque_changes({b"k%d" % i: b"v" for i in range(10)}, max_parallelism=M))
_plain = FileEntry.written("shared/v0000000001-snapshot-0011223344556677.arrow", "snapshot", 1, _enc)
_slice = FileEntry("shared/v0000000002-delta-8899aabbccddeeff.arrow", "delta", 2, 10, "crc32:00000001", 3, 4, 5,
                   "crc32:00000002", partition=1, modulus=4, residue=3, file_format=2)
_imaged = FileEntry("shared/v0000000003-snapshot-0123456789abcdef.arrow", "snapshot", 3, 10, "crc32:00000001", 3,
                    4, 5, "crc32:00000002", file_format=2,
                    image=ImageEntry("shared/v0000000003-image-0123456789abcdef.img", 100, "crc32:0000abcd", 3))
_image = rowimage.encode(opaque_changes({b"k%07d" % i: b"v" * 8 for i in range(300)}, hash_of=sum,
                                        max_parallelism=M), block_bytes=1024)
_savepoint = SavepointMetadata("q-1", 3, 2, M, "file:/ckpt", 1_700_000_000_000,
                               ({"operator": 0, "partition": 0, "name": "default", "version": 4, "rows": 3},),
                               (SavepointFile("state/0/0/chk-4/_metadata", 3, "crc32:00000000"),))

#: name -> (intact bytes, reader, whether the record vouches for its content: a checksum, so damage that
#: reads must read as written)
READERS = {
    "manifest": (Manifest(3, M, (_plain, _slice, _imaged), None, query_id="q-1").to_json(),
                 lambda d: Manifest.from_json(d, "m"), True),
    "compaction record": (CompactionRecord(3, "c0ffee", _imaged).to_json(),
                          lambda d: CompactionRecord.from_json(d, "r"), True),
    "reference record": (Reference(2, 6, ("shared/a.arrow", "shared/b.arrow")).to_json(), Reference.from_json,
                         True),
    "savepoint _metadata": (_savepoint.to_json(), lambda d: SavepointMetadata.from_json(d, "s"), True),
    "row image": (_image.data, lambda d: list(rowimage.RowImage(d, "i")), True),
    "offsets": (b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{"spark.sql.shuffle.partitions":"2"}}\n'
                b'{"logOffset":3}', lambda d: OffsetSeq.parse(d, "o"), False),
    "commits": (b'v1\n{"nextBatchWatermarkMs":0}', lambda d: parse_commit(d, "c"), False),
    "metadata": (b'{"id":"0b5c1f7e-3f2a-4c1e-9a53-8f3c2d1e0a9b"}', lambda d: parse_query_id(d, "md"), False),
    "operator metadata": (b'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},"stateStoreInfo":'
                          b'[{"storeName":"default","numColsPrefixKey":0,"numPartitions":2}]}',
                          lambda d: OperatorMetadata.parse(d, "op"), False),
}
NAMES = sorted(READERS)


@pytest.mark.parametrize("name", NAMES)
@fuzz_settings(400)
@given(st.one_of(mutations, numbers_near_end(200)))
def test_a_damaged_record_is_refused_or_read_as_written(name, mutation):
    intact, read, vouched = READERS[name]
    read_damaged(read, mutation.apply(intact), read(intact) if vouched else None)


@pytest.mark.parametrize("name", [n for n in NAMES if READERS[n][2]])
@fuzz_settings(150)
@given(flips)
def test_bit_flips_in_a_checksummed_record_never_read_as_other_data(name, mutation):
    intact, read, _ = READERS[name]
    read_damaged(read, mutation.apply(intact), read(intact))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("nested", [b"[" * 100_000, b'{"a":' * 50_000, b"v1\n" + b"[" * 100_000])
def test_json_nested_deeper_than_python_recurses_is_a_named_error(name, nested):
    """Regression: json.loads raises RecursionError (not a ValueError) for deep nesting; every record
    reader (and the worker's frame header) let it escape."""
    with pytest.raises(SparkStateError):
        READERS[name][1](nested)


def test_a_flipped_file_name_in_a_reference_record_is_refused():
    """Regression: reference records had no checksum, so a flipped character named another file, and
    retention could delete the file the record really protects (another store's chain needs it)."""
    intact = Reference(2, 6, ("shared/a.arrow",)).to_json()
    damaged = intact.replace(b"a.arrow", b"c.arrow")
    with pytest.raises(ChecksumMismatch):
        Reference.from_json(damaged)
