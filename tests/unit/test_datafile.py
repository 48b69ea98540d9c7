"""The state file format: round trips, key-group subsets by byte range, checksums."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.format import datafile as snapshot, tables
from spark_state.format.tables import CHANGES_SCHEMA
from tests.support.changes import changes_table

M = 64


def make_table(rows):
    """rows: list of (hash, key, value)."""
    return changes_table([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], max_parallelism=M)


def as_set(table):
    return sorted(zip(table.column("kg").to_pylist(), table.column("hash").to_pylist(),
                      table.column("key").to_pylist(), table.column("value").to_pylist()),
                  key=lambda r: (r[0], r[1], r[2], r[3] is None, r[3] or b""))


class RangeRecorder:
    """Serves byte ranges of one file and remembers which ones were asked for."""

    def __init__(self, data):
        self.data, self.asked = data, []

    def __call__(self, ranges):
        self.asked.extend(ranges)
        return [self.data[a:b] for a, b in ranges]

    def bytes_read(self):
        return sum(b - a for a, b in self.asked)


rows_strategy = st.lists(
    st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=300))),
    max_size=80, unique_by=lambda r: r[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_strategy, st.sets(st.integers(0, M - 1)), st.sampled_from([64, 1024, 1 << 20]))
def test_round_trip_and_subsets(rows, wanted, target):
    table = make_table(rows)
    enc = snapshot.encode(table, 3, target_batch_bytes=target)
    assert enc.rows == len(rows) and enc.size == len(enc.data)
    snapshot.check_whole(enc.data, "f", enc.size, enc.checksum)
    full = snapshot.decode(enc.data, "f")
    assert full.schema == CHANGES_SCHEMA
    assert as_set(full) == as_set(table)
    kgs = full.column("kg").to_numpy()
    assert (np.diff(kgs) >= 0).all(), "rows must be ordered by key group"
    assert snapshot.read_trailer(enc.data, "f") == (enc.index_offset, enc.index_length)
    wanted_arr = np.array(sorted(wanted), dtype=np.int32)
    sub = snapshot.read_key_groups(RangeRecorder(enc.data), "f", enc.index_offset, enc.index_length,
                                   enc.index_checksum, wanted_arr)
    expected = table.filter(pa.array(np.isin(table.column("kg").to_numpy(), wanted_arr)))
    assert as_set(sub) == as_set(expected)
    assert (np.diff(sub.column("kg").to_numpy()) >= 0).all()


def test_subset_reads_only_its_batches():
    rng = np.random.default_rng(7)
    n = 20_000
    hashes = rng.integers(-(2**31), 2**31, n).astype(np.int32)
    rows = [(int(h), i.to_bytes(8, "little"), bytes(rng.integers(0, 4, 100, dtype=np.uint8))) for i, h in enumerate(hashes)]
    enc = snapshot.encode(make_table(rows), 3, target_batch_bytes=16 * 1024)
    rec = RangeRecorder(enc.data)
    sub = snapshot.read_key_groups(rec, "f", enc.index_offset, enc.index_length, enc.index_checksum,
                                   np.array([5], dtype=np.int32))
    assert sub.num_rows == int((np.mod(hashes.astype(np.int64), M) == 5).sum()) > 0
    data_bytes = enc.index_offset
    assert rec.bytes_read() - enc.index_length < data_bytes / 10, "a subset read must not fetch the whole file"


def test_empty_file_and_empty_key_groups():
    enc = snapshot.encode(tables.empty_table())
    assert snapshot.decode(enc.data, "f").num_rows == 0
    assert snapshot.read_key_groups(RangeRecorder(enc.data), "f", enc.index_offset, enc.index_length,
                                    enc.index_checksum, np.array([1, 2], dtype=np.int32)).num_rows == 0
    enc = snapshot.encode(make_table([(1, b"a", b"x"), (3, b"b", b"y")]))
    assert snapshot.read_key_groups(RangeRecorder(enc.data), "f", enc.index_offset, enc.index_length,
                                    enc.index_checksum, np.array([2], dtype=np.int32)).num_rows == 0


def test_value_larger_than_16_mib():
    big = np.random.default_rng(1).bytes(17 * 1024 * 1024)
    table = make_table([(5, b"big", big), (5, b"small", b"s"), (6, b"other", b"o")])
    enc = snapshot.encode(table, 1)
    full = snapshot.decode(enc.data, "f")
    assert dict(zip(full.column("key").to_pylist(), full.column("value").to_pylist()))[b"big"] == big
    sub = snapshot.read_key_groups(RangeRecorder(enc.data), "f", enc.index_offset, enc.index_length,
                                   enc.index_checksum, np.array([5], dtype=np.int32))
    assert sorted(sub.column("key").to_pylist()) == [b"big", b"small"]


@pytest.mark.parametrize("where", ["first", "middle", "index", "last"])
def test_corruption_is_detected_and_names_the_file(where):
    rows = [(i * 7919, b"k%d" % i, b"v" * (i % 50)) for i in range(2000)]
    enc = snapshot.encode(make_table(rows), 3, target_batch_bytes=4096)
    pos = {"first": 200, "middle": enc.index_offset // 2, "index": enc.index_offset + 40, "last": enc.size - 20}[where]
    bad = bytearray(enc.data)
    bad[pos] ^= 0x40
    with pytest.raises(ChecksumMismatch, match="shared/v1-x.arrow"):
        snapshot.check_whole(bytes(bad), "shared/v1-x.arrow", enc.size, enc.checksum)
    if where in ("middle", "index"):  # a subset read verifies what it reads, even without the whole-file CRC
        with pytest.raises(ChecksumMismatch, match="shared/v1-x.arrow"):
            snapshot.read_key_groups(RangeRecorder(bytes(bad)), "shared/v1-x.arrow", enc.index_offset,
                                     enc.index_length, enc.index_checksum, np.arange(M, dtype=np.int32))


def test_truncated_file_is_detected():
    enc = snapshot.encode(make_table([(i, b"k%d" % i, b"v") for i in range(100)]))
    with pytest.raises(ChecksumMismatch, match="has 50 bytes but its manifest recorded"):
        snapshot.check_whole(enc.data[:50], "f", enc.size, enc.checksum)
    with pytest.raises(ChecksumMismatch):
        snapshot.decode(enc.data[:enc.index_offset // 2], "f")
    with pytest.raises(ChecksumMismatch):
        snapshot.read_key_groups(RangeRecorder(enc.data[:enc.index_offset + 10]), "f", enc.index_offset,
                                 enc.index_length, enc.index_checksum, np.array([1], dtype=np.int32))


def test_newer_file_format_is_refused():
    enc = snapshot.encode(make_table([(1, b"a", b"b")]))
    newer = enc.data[:-1] + bytes([snapshot.NEWEST_FILE_FORMAT + 1])
    with pytest.raises(FormatVersionError, match="newer"):
        snapshot.read_trailer(newer, "f")


def test_data_part_is_a_plain_arrow_stream():
    """Any Arrow reader can open a state file: nothing proprietary, nothing pickled."""
    table = make_table([(i, b"k%d" % i, b"v%d" % i) for i in range(10)])
    enc = snapshot.encode(table)
    plain = pa.ipc.open_stream(enc.data).read_all()
    assert as_set(plain) == as_set(table)
    index = pa.ipc.open_stream(enc.data[enc.index_offset:enc.index_offset + enc.index_length]).read_all()
    assert index.schema == snapshot.INDEX_SCHEMA
