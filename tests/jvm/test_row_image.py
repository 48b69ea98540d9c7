"""The JVM's row images (RowImageWriter, RowImage, BlockCache) against a dict model, through a real JVM
(tests/jvm/RowImageProbe.java; its cursors read ahead 700 bytes at a time, so scans cross many reads).

Every file the Java writer produces is also parsed here by a small reader written from issue 23's row
image spec with struct, zlib and zstandard, so the format is checked from outside Java: trailer, index
CRC, block CRCs, packing, sort order and the UnsafeRow bytes of every record."""

from __future__ import annotations

import itertools
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.jvm_probes import ProbeProcess, probe_command

TRAILER = struct.Struct("<QQIIII7sB")
ENTRY = struct.Struct("<QQQIIII")
HEADER = struct.Struct("<iiii")
RELOAD = "the store will reload its state from the checkpoint"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cmd = probe_command("RowImageProbe.java", "io.sparkstate.shim.engine.RowImageProbe",
                        tmp_path_factory.mktemp("rowimage-probe"), "-ea", "-Dspark_state.rowImageReadAhead=700",
                        heap="256m")
    probe = Probe(cmd, tmp_path_factory.mktemp("rowimages"))
    yield probe
    probe.close()


class Probe(ProbeProcess):
    def __init__(self, cmd: list[str], files: Path):
        super().__init__(cmd)
        self.files = files
        self.count = itertools.count()

    def write(self, records: list, block_bytes: int, codec: str = "zstd", order: str = "sorted") -> Path:
        """Writes records [(kg, hash, key, value or None)] with the Java writer; returns the file."""
        path = self.files / f"image-{next(self.count)}.rimg"
        lines = [f"write {path} {block_bytes} {codec} {order} {len(records)}"]
        lines += [f"{kg} {hsh} {h(k)} {'~' if v is None else h(v)}" for kg, hsh, k, v in records]
        self.send("\n".join(lines))
        answer = self.read()
        assert answer == f"OK {path.stat().st_size}", answer
        return path

    def scan(self) -> list:
        self.send("scan")
        rows = []
        while (line := self.read()) != "END":
            assert line.startswith("R "), line
            _, kg, hsh, k, v = line.split(" ")
            rows.append((int(kg), int(hsh), unh(k), None if v == "~" else unh(v)))
        return rows


def h(b: bytes) -> str:
    return b.hex() or "-"


def unh(s: str) -> bytes:
    return b"" if s == "-" else bytes.fromhex(s)


def sort_key(kg: int, hsh: int) -> int:
    return kg << 32 | (hsh & 0xFFFFFFFF)


def unsafe_row(field: bytes) -> bytes:
    """Spark's UnsafeRow of one non-null string or binary column: null bits, the slot (offset << 32 | size),
    the bytes padded with zeros to a multiple of 8."""
    return struct.pack("<qq", 0, 16 << 32 | len(field)) + field + bytes(-len(field) % 8)


@dataclass
class Image:
    codec: int
    flags: int
    blocks: list  # (raw length, record count)
    records: list  # (kg, hash, key row bytes, value row bytes or None)


def read_image(path: Path) -> Image:
    """Parses a row image per the spec, asserting every rule a reader can check."""
    data = path.read_bytes()
    assert len(data) >= TRAILER.size
    index_offset, total, nblocks, index_crc, codec, flags, magic, version = TRAILER.unpack_from(data, len(data) - 40)
    assert (magic, version) == (b"SPKSTRI", 2)
    assert codec in (0, 1) and flags in range(4)
    filter_words = []
    if flags & 2:   # a key filter between the index and the trailer
        words, k, crc, reserved = struct.unpack_from("<IIII", data, len(data) - 56)
        assert 1 <= k <= 30 and reserved == 0
        start = len(data) - 56 - 8 * words
        assert zlib.crc32(data[start:start + 8 * words]) == crc
        filter_words = list(struct.unpack_from(f"<{words}Q", data, start))
        filter_hashes = k
    tail = (8 * len(filter_words) + 16 if flags & 2 else 0) + TRAILER.size
    assert index_offset + nblocks * ENTRY.size + tail == len(data)
    index = data[index_offset:index_offset + nblocks * ENTRY.size]
    assert zlib.crc32(index) == index_crc
    blocks, records, at = [], [], 0
    for b in range(nblocks):
        first, last, offset, stored, raw, crc, n = ENTRY.unpack_from(index, b * ENTRY.size)
        assert offset == at, "blocks follow each other with no gaps from byte 0"
        at += stored
        blob = data[offset:offset + stored]
        assert zlib.crc32(blob) == crc
        block = zstandard.ZstdDecompressor().decompress(blob, max_output_size=raw) if codec == 1 else blob
        assert len(block) == raw
        p, mine = 0, []
        while p < raw:
            kg, hsh, kl, vl = HEADER.unpack_from(block, p)
            assert kg >= 0 and kl % 8 == 0 and (vl == -1 or (vl >= 0 and vl % 8 == 0))
            assert vl != -1 or flags & 1
            key = block[p + 16:p + 16 + kl]
            value = None if vl == -1 else block[p + 16 + kl:p + 16 + kl + vl]
            mine.append((kg, hsh, key, value))
            p += 16 + kl + max(vl, 0)
        assert p == raw and len(mine) == n
        assert sort_key(*mine[0][:2]) == first and sort_key(*mine[-1][:2]) == last
        blocks.append((raw, n))
        records += mine
    assert at == index_offset and len(records) == total
    keys = [sort_key(kg, hsh) for kg, hsh, _, _ in records]
    assert keys == sorted(keys)
    assert len({r[2] for r in records}) == len(records), "a key appears at most once in a file"
    assert bool(flags & 1) == any(r[3] is None for r in records)
    if filter_words:
        assert len(filter_words) == max(1, -(-10 * total // 64)), "10 bits per record"
        for _, hsh, _, _ in records:
            assert all(filter_words[b >> 6] >> (b & 63) & 1 for b in filter_bits(hsh, len(filter_words), filter_hashes))
    return Image(codec, flags, blocks, records)


def filter_bits(hsh: int, words: int, k: int) -> list[int]:
    """The key filter's bit positions of a record's hash, written from docs/row-image.md (format 2)."""
    mask = (1 << 64) - 1
    z = ((hsh & 0xFFFFFFFF) + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z = z ^ (z >> 31)
    a, b, m = z & 0xFFFFFFFF, (z >> 32) | 1, 64 * words
    return [((((a + i * b) & 0xFFFFFFFF) * m) & mask) >> 32 for i in range(k)]


def check_packing(image: Image, block_bytes: int) -> None:
    """A block takes records while its raw size stays <= blockBytes; a larger record gets a block of its own."""
    sizes = [16 + len(k) + len(v or b"") for _, _, k, v in image.records]
    i = 0
    for raw, n in image.blocks:
        assert raw == sum(sizes[i:i + n])
        assert raw <= block_bytes or n == 1
        if i + n < len(sizes):
            assert raw + sizes[i + n] > block_bytes, "a block was cut before it was full"
        i += n


keys = st.one_of(st.binary(max_size=24), st.binary(min_size=150, max_size=400))
values = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=200, max_size=600))
# Few key groups and hashes: many records share a sort key (collisions); negative hashes sort after positive.
key_groups = st.one_of(st.integers(0, 1), st.integers(0, 3), st.integers(0, 2**31 - 1))
hashes = st.one_of(st.sampled_from([0, -1]), st.sampled_from([0, 1, -1, 7, 2**31 - 1, -2**31]),
                   st.integers(-2**31, 2**31 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.dictionaries(keys, st.tuples(key_groups, hashes, values), max_size=60),
       absent=st.lists(st.tuples(keys, st.one_of(st.none(), st.tuples(key_groups, hashes))), max_size=10),
       block_bytes=st.sampled_from([16, 64, 256, 4096, 16384]), codec=st.sampled_from(["zstd", "raw"]),
       order=st.sampled_from(["sorted", "unsorted"]), verify=st.booleans(),
       cache_bytes=st.sampled_from([0, 300, 5000, 1 << 20]), data=st.data())
def test_an_image_holds_exactly_its_records(probe, model, absent, block_bytes, codec, order, verify, cache_bytes,
                                            data):
    records = [(kg, hsh, k, v) for k, (kg, hsh, v) in model.items()]
    if order == "sorted":
        records.sort(key=lambda r: sort_key(r[0], r[1]))
    path = probe.write(records, block_bytes, codec, order)

    image = read_image(path)
    assert image.codec == (1 if codec == "zstd" else 0)
    check_packing(image, block_bytes)
    expected = {(kg, hsh, unsafe_row(k), None if v is None else unsafe_row(v)) for kg, hsh, k, v in records}
    assert set(image.records) == expected

    assert probe.ask(f"open {path} {int(verify)} {cache_bytes}") == f"OK {len(records)} {len(image.blocks)}"
    scanned = probe.scan()
    assert [sort_key(kg, hsh) for kg, hsh, _, _ in scanned] == [sort_key(kg, hsh) for kg, hsh, _, _ in image.records]
    assert sorted(scanned, key=repr) == sorted(records, key=repr)

    lookups, want = [], []
    for kg, hsh, k, v in records:
        lookups.append((kg, hsh, k))
        want.append("DELETED" if v is None else h(v))
    for k, where in absent:
        if k in model:
            continue
        if where is None and records:   # an absent key sharing a present key's sort key
            kg, hsh, _, _ = data.draw(st.sampled_from(records))
        else:
            kg, hsh = where or (0, 0)
        lookups.append((kg, hsh, k))
        want.append("NULL")
    if lookups:
        assert probe.ask("get " + " ".join(f"{kg} {hsh} {h(k)}" for kg, hsh, k in lookups)).split(" ") == want
    used, _, capacity = map(int, probe.ask("cache").split())
    assert used <= capacity
    assert probe.scan() == scanned, "a scan over cached blocks sees the same records"
    assert probe.ask("held") == "OK"


def test_an_empty_image(probe):
    path = probe.write([], 256)
    assert path.stat().st_size == 40 + 8 + 16   # trailer, a one-word key filter and its header
    assert read_image(path).records == []
    assert probe.ask(f"open {path} 1 1000") == "OK 0 0"
    assert probe.scan() == []
    assert probe.ask("get 0 0 61") == "NULL"


def test_records_larger_than_a_block_get_blocks_of_their_own(probe):
    records = [(1, i, f"key-{i}".encode(), bytes([i]) * 100) for i in range(10)]
    path = probe.write(records, 64)
    image = read_image(path)
    assert image.blocks == [(16 + 24 + 120, 1)] * 10
    assert probe.ask(f"open {path} 1 0") == "OK 10 10"
    assert probe.ask("get 1 3 6b65792d33 1 4 6b65792d33") == h(bytes([3]) * 100) + " NULL"


@pytest.mark.parametrize("block_bytes", [256, 4096])
def test_many_keys_of_one_sort_key_across_restarts_and_blocks(probe, block_bytes):
    """A lookup binary-searches a block's restarts (every 8th record): keys sharing a sort key may start
    before the restart it lands on, and continue into the next blocks."""
    records = [(2, -5, f"same-{i}".encode(), f"v{i}".encode()) for i in range(40)]
    records = [(2, -6, b"before", b"b")] + records + [(2, -4, b"after", b"a"), (3, -5, b"next-group", b"n")]
    path = probe.write(records, block_bytes)
    assert probe.ask(f"open {path} 1 100000").startswith("OK")
    ask, want = get_all(records)
    assert probe.ask(ask) == want
    assert probe.ask("get 2 -5 6265666f7265 2 -5 6166746572 2 -5 61") == "NULL NULL NULL"


def test_out_of_order_records_are_refused_and_leave_no_file(probe):
    path = probe.files / "refused.rimg"
    probe.send(f"write {path} 256 zstd sorted 2\n0 5 61 62\n0 4 63 64")
    answer = probe.read()
    assert answer.startswith("ERR IllegalArgumentException: spark_state: row image records out of order"), answer
    assert not path.exists()


def many_records(n: int = 2000) -> list:
    records = [(i % 7, (i * 2654435761) % 2**32 - 2**31, f"key-{i}".encode(),
                None if i % 11 == 0 else f"value-{i}".encode() * (1 + i % 3)) for i in range(n)]
    return sorted(records, key=lambda r: sort_key(r[0], r[1]))


def get_all(records: list) -> tuple[str, str]:
    return ("get " + " ".join(f"{kg} {hsh} {h(k)}" for kg, hsh, k, _ in records),
            " ".join("DELETED" if v is None else h(v) for *_, v in records))


def test_a_small_cache_stays_within_its_bound_and_rows_handed_out_never_change(probe):
    records = many_records()
    path = probe.write(records, 512)
    nblocks = len(read_image(path).blocks)
    assert probe.ask(f"open {path} 1 4000") == f"OK {len(records)} {nblocks}"
    ask, want = get_all(records)
    for _ in range(2):
        assert probe.ask(ask) == want
    used, cached, capacity = map(int, probe.ask("cache").split())
    assert 0 < used <= capacity == 4000 and 0 < cached < nblocks
    assert probe.ask("held") == "OK"


def test_threads_share_an_image_and_its_cache(probe):
    """Several tasks look keys up at once over one small cache: blocks are evicted and loaded again under
    them, every answer is right and every row a thread keeps keeps its bytes."""
    records = many_records(5000)
    path = probe.write(records, 256)
    assert probe.ask(f"open {path} 1 3000").startswith("OK")
    answer = probe.ask("race 4 50000")
    assert answer == "OK 200000", answer


# ---------------------------------------------------------------------------------------------- corruption

@pytest.fixture
def damaged(probe):
    """Writes an image of many blocks; returns (image, parsed, write(bytes) -> path of a damaged copy)."""
    records = many_records(500)
    path = probe.write(records, 256)
    image = read_image(path)
    copies = itertools.count()

    def write(data: bytes) -> Path:
        copy = path.with_name(f"{path.stem}-damaged-{next(copies)}.rimg")
        copy.write_bytes(data)
        return copy

    return path, records, image, write


def assert_corrupt(answer: str, path: Path, *words: str) -> None:
    assert answer.startswith("ERR RowImageException: spark_state: the state file "), answer
    assert str(path) in answer and "is corrupt" in answer and RELOAD in answer, answer
    for word in words:
        assert word in answer, answer


@pytest.mark.parametrize("keep", [0, 10, 39, "half", "all-but-1", "all-but-40"])
def test_a_truncated_image_is_refused_at_open(probe, damaged, keep):
    path, _, _, write = damaged
    data = path.read_bytes()
    n = {"half": len(data) // 2, "all-but-1": len(data) - 1, "all-but-40": len(data) - 40}.get(keep, keep)
    copy = write(data[:n])
    assert_corrupt(probe.ask(f"open {copy} 1 10000"), copy)


def test_bad_magic_is_refused(probe, damaged):
    path, _, _, write = damaged
    data = bytearray(path.read_bytes())
    data[-8] ^= 0x20
    copy = write(bytes(data))
    assert_corrupt(probe.ask(f"open {copy} 1 10000"), copy, "no row image trailer")


def test_a_newer_format_version_asks_for_an_upgrade(probe, damaged):
    path, _, _, write = damaged
    data = bytearray(path.read_bytes())
    data[-1] = 4
    copy = write(bytes(data))
    answer = probe.ask(f"open {copy} 1 10000")
    assert answer.startswith("ERR RowImageException: "), answer
    assert str(copy) in answer and "written by a newer spark_state" in answer and "version 4" in answer, answer
    assert "upgrade spark_state" in answer and RELOAD in answer, answer


def test_a_damaged_index_is_refused_at_open(probe, damaged):
    path, _, image, write = damaged
    data = bytearray(path.read_bytes())
    index_offset = TRAILER.unpack_from(data, len(data) - 40)[0]
    data[index_offset + 40 * 3 + 20] ^= 0x01
    copy = write(bytes(data))
    assert_corrupt(probe.ask(f"open {copy} 1 10000"), copy, "block index fails its CRC-32")


def block_of(image: Image, record_index: int) -> int:
    seen = 0
    for b, (_, n) in enumerate(image.blocks):
        seen += n
        if record_index < seen:
            return b
    raise AssertionError(record_index)


@pytest.mark.parametrize("codec", ["zstd", "raw"])
def test_a_flipped_bit_in_a_block_fails_its_checksum(probe, tmp_path, codec):
    records = many_records(500)
    path = probe.write(records, 256, codec)
    image = read_image(path)
    data = bytearray(path.read_bytes())
    entries = [ENTRY.unpack_from(data, TRAILER.unpack_from(data, len(data) - 40)[0] + 40 * b)
               for b in range(len(image.blocks))]
    target = 5
    offset, stored = entries[target][2], entries[target][3]
    data[offset + stored // 2] ^= 0x10
    copy = tmp_path / "flipped.rimg"
    copy.write_bytes(bytes(data))

    assert probe.ask(f"open {copy} 1 100000") == f"OK {len(records)} {len(image.blocks)}"
    inside = [i for i in range(len(records)) if block_of(image, i) == target][0]
    outside = [i for i in range(len(records)) if block_of(image, i) != target][0]
    kg, hsh, k, v = records[outside]
    assert probe.ask(f"get {kg} {hsh} {h(k)}") == ("DELETED" if v is None else h(v))
    kg, hsh, k, _ = records[inside]
    where = f"block {target} of {len(image.blocks)}"
    assert_corrupt(probe.ask(f"get {kg} {hsh} {h(k)}"), copy, where, "CRC-32 mismatch")
    probe.send("scan")
    while (line := probe.read()).startswith("R "):
        pass
    assert_corrupt(line, copy, where, "CRC-32 mismatch")


def test_a_damaged_record_is_caught_without_checksums(probe, tmp_path):
    """With verifyChecksums off, a block's records are still checked before any lookup reads them, so
    damage that breaks their structure is a clear error, never a read outside the block."""
    records = many_records(500)
    path = probe.write(records, 256, "raw")
    image = read_image(path)
    data = bytearray(path.read_bytes())
    offset = ENTRY.unpack_from(data, TRAILER.unpack_from(data, len(data) - 40)[0] + 40 * 4)[2]
    data[offset + 8 + 3] ^= 0x40   # the first record's keyLength, high byte
    copy = tmp_path / "bad-length.rimg"
    copy.write_bytes(bytes(data))
    assert probe.ask(f"open {copy} 0 100000").startswith("OK")
    kg, hsh, k, _ = records[[i for i in range(len(records)) if block_of(image, i) == 4][0]]
    assert_corrupt(probe.ask(f"get {kg} {hsh} {h(k)}"), copy, f"block 4 of {len(image.blocks)}", "lengths")


def test_a_damaged_key_filter_is_refused_at_open(probe, damaged):
    path, _, _, write = damaged
    data = bytearray(path.read_bytes())
    words = struct.unpack_from("<I", data, len(data) - 56)[0]
    data[len(data) - 56 - 8 * words + 3] ^= 0x10
    copy = write(bytes(data))
    answer = probe.ask(f"open {copy} 1 10000")
    assert answer.startswith("ERR RowImageException: "), answer
    assert str(copy) in answer and "key filter fails its CRC-32" in answer and RELOAD in answer, answer


def test_the_key_filter_rules_out_almost_every_absent_key(probe):
    """At 10 bits per record, about 0.8% of absent keys pass the filter (a block read each): a lookup of an
    absent key reads no block in at least 98% of cases here (10,000 absent hashes, a wide margin)."""
    records = [(i % 7, (i * 2654435761) & 0x7FFFFFFF, f"k{i}".encode(), b"v") for i in range(2000)]
    path = probe.write(sorted(records, key=lambda r: sort_key(r[0], r[1])), 4096)
    image = read_image(path)
    assert image.flags & 2
    assert probe.ask(f"open {path} 1 100000").startswith("OK")
    passed = probe.ask("filter 10000 12345")
    assert passed.startswith("OK "), passed
    assert int(passed.split()[1]) <= 200, passed


def test_the_key_filter_sets_the_bits_the_python_writer_sets(probe):
    """The JVM's key filter and the worker's (spark_state/format/keyfilter.py) agree bit for bit: the test
    vectors the Python side wrote (tests/fixtures/rowimage/keyfilter-vectors.json), filters of 64 bits to
    past 2**32 bits (where the 64-bit products wrap) and up to 30 probes."""
    import json

    from tests.support.paths import TESTS

    vectors = json.loads((TESTS / "fixtures" / "rowimage" / "keyfilter-vectors.json").read_text())["positions"]
    assert len(vectors) > 100
    for v in vectors:
        answer = probe.ask(f"positions {v['hash']} {v['k']} {v['m']}")
        assert answer == "OK " + " ".join(str(b) for b in v["bits"]), (v, answer)


def test_a_filter_header_whose_hash_count_was_changed_is_refused_at_open(probe, damaged):
    """No CRC covers the header's k; a raised k makes the filter deny keys the file holds, which the reader
    catches at open: each block's first and last record must pass the filter."""
    path, _, _, write = damaged
    data = bytearray(path.read_bytes())
    k_at = len(data) - 56 + 4
    assert struct.unpack_from("<I", data, k_at)[0] == 7
    struct.pack_into("<I", data, k_at, 30)
    copy = write(bytes(data))
    answer = probe.ask(f"open {copy} 1 10000")
    assert answer.startswith("ERR RowImageException: "), answer
    assert str(copy) in answer and "key filter rules out a key" in answer and RELOAD in answer, answer


def test_a_raised_hash_count_is_refused_in_an_image_of_more_blocks_than_the_reader_checks(probe, tmp_path):
    """The reader asks the filter for the first and last hash of about 1,024 blocks spread over the image
    (every block was 240,000 random probes in a 10M-row image's open); in an image of more blocks than that, a
    raised k is still caught."""
    path = probe.write(many_records(8000), 256)
    blocks = len(read_image(path).blocks)
    assert blocks > 2 * 1024, blocks   # more than twice the blocks the reader checks: it samples them
    data = bytearray(path.read_bytes())
    k_at = len(data) - 56 + 4
    struct.pack_into("<I", data, k_at, 9)   # two more bits per hash: about 3 in 4 hashes denied
    copy = tmp_path / "raised-k.rimg"
    copy.write_bytes(bytes(data))
    answer = probe.ask(f"open {copy} 1 10000")
    assert answer.startswith("ERR RowImageException: ") and "key filter rules out a key" in answer, answer
    assert probe.ask(f"open {path} 1 10000").startswith("OK"), "the undamaged image opens"
