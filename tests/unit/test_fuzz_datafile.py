"""Fuzzed data files (opaque, typed with dictionaries, typed deltas): damaged bytes give a ChecksumMismatch
(or FormatVersionError) or, with checksums on, exactly the rows that were written; never a crash, a hang or
another exception. With checksums on, memory stays within a small multiple of the file's size.

Whole reads check the file's CRC before decoding; key-group reads check the index's CRC, each batch's, and
(typed files) the stream's head by the whole file's CRC. With ``verifyChecksums=false`` nothing vouches
for the bytes: the rows are validated in full so a damaged file cannot crash the worker, but Arrow still
allocates what a damaged compressed-buffer length claims (known limit, see ``test_unverified_...``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_state.errors import ChecksumMismatch, SparkStateError
from spark_state.format import datafile
from tests.support.changes import opaque_changes, typed_changes
from tests.support.fuzzing import flips, fuzz_settings, mutations, numbers_near_end, read_damaged

M = 64
KEY = pa.struct([("user", pa.string()), ("n", pa.int64())])
VALUE = pa.struct([("total", pa.int64()), ("page", pa.string())])
WANTED = np.array([1, 5, 17, 40], dtype=np.int32)


def _typed(n: int) -> pa.Table:
    rows = [({"user": f"u{i}", "n": i}, {"total": i * 3, "page": f"p{i % 5}"}) for i in range(n)]
    return typed_changes(rows, KEY, VALUE, hash_of=lambda k: k["n"] * 7919, max_parallelism=M)


FILES = {
    "opaque": datafile.encode(opaque_changes({b"k%d" % i: b"v" * (i % 9) for i in range(300)},
                                             hash_of=lambda k: sum(k) * 31, max_parallelism=M),
                              target_batch_bytes=1024),
    # >= 128 rows of 5 pages: the page column is a dictionary, held in the stream's head
    "typed": datafile.encode(_typed(300), target_batch_bytes=2048),
    "delta": datafile.encode(_typed(200), arrival_order=True, target_batch_bytes=2048),
}
damage = st.one_of(mutations, numbers_near_end(400))


def _whole(enc, data: bytes, verify: bool = True) -> pa.Table:
    if verify:
        datafile.check_whole(data, "f", enc.size, enc.checksum)
    return datafile.decode(data, "f", M, verified=verify)


def _subset(enc, data: bytes, verify: bool = True) -> pa.Table:
    return datafile.read_key_groups(lambda ranges: [data[a:b] for a, b in ranges], "f", enc.index_offset,
                                    enc.index_length, enc.index_checksum, WANTED, verify,
                                    file_format=enc.file_format, max_parallelism=M, checksum=enc.checksum)


def _same(a: pa.Table, b: pa.Table) -> bool:
    return a.equals(b)


@pytest.mark.parametrize("kind", sorted(FILES))
@fuzz_settings(300)
@given(damage)
def test_a_damaged_file_is_refused_or_read_as_written(kind, mutation):
    enc = FILES[kind]
    data = mutation.apply(enc.data)
    read_damaged(lambda d: _whole(enc, d), data, _whole(enc, enc.data), equal=_same)
    read_damaged(lambda d: _subset(enc, d), data, _subset(enc, enc.data), equal=_same)


@pytest.mark.parametrize("kind", sorted(FILES))
@fuzz_settings(150)
@given(flips)
def test_bit_flips_never_pass_the_checksums(kind, mutation):
    enc = FILES[kind]
    data = mutation.apply(enc.data)
    assert isinstance(read_damaged(lambda d: _whole(enc, d), data, None), ChecksumMismatch)
    subset = read_damaged(lambda d: _subset(enc, d), data, _subset(enc, enc.data), equal=_same)
    assert subset is None or isinstance(subset, ChecksumMismatch)


@pytest.mark.parametrize("kind", sorted(FILES))
@fuzz_settings(150)
@given(damage)
def test_unverified_damaged_files_raise_a_named_error_or_read_rows(kind, mutation):
    """verifyChecksums=false: any rows may come back, but only valid Arrow data or a named error (before
    full validation, a damaged offset crashed the worker in a later take or filter). Memory is not bounded
    here: Arrow allocates what a damaged compressed-buffer length claims before decompressing."""
    enc = FILES[kind]
    data = mutation.apply(enc.data)
    for read in (_whole, _subset):
        try:
            read(enc, data, verify=False)
        except SparkStateError:
            pass


def test_unverified_rows_with_offsets_past_their_data_are_refused():
    """Regression: a batch whose string offsets point outside its data decoded without complaint (Arrow's
    IPC reader checks only the last offset) and crashed the process (segfault) in the next kernel;
    unverified bytes are now validated in full."""
    table = opaque_changes({b"ab": b"x", b"cd": b"y"}, max_parallelism=M)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    intact = sink.getvalue().to_pybytes()
    offsets = np.array([0, 2, 4], dtype=np.int32).tobytes()
    assert intact.count(offsets) == 1
    damaged = intact.replace(offsets, np.array([0, 3000, 4], dtype=np.int32).tobytes())
    with pytest.raises(ChecksumMismatch, match="invalid rows"):
        datafile.decode(damaged, "f", M)


def test_a_damaged_head_of_a_typed_file_fails_a_verified_key_group_read():
    """Regression: a key-group read checked the index and each batch, never the head (schema and
    dictionaries) it decodes them with: a renamed field or a changed dictionary string came back as data."""
    enc = FILES["typed"]
    at = enc.data.index(b"page")
    damaged = enc.data[:at] + b"pagf" + enc.data[at + 4:]
    assert at < int(datafile.decode_index(enc.data[enc.index_offset:enc.index_offset + enc.index_length], "f",
                                          None).column("offset")[0].as_py())   # in the head
    with pytest.raises(ChecksumMismatch, match="head"):
        _subset(enc, damaged)
