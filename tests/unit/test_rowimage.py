"""spark_state.format.rowimage: the bytes follow the spec (checked by a parser written from the spec, not
the module's reader), every key is found and nothing else, blocks are packed greedily within their size,
the key filter (format version 2) never denies a record and sits where the sizes say, and truncated,
bit-flipped, mislabelled or newer files fail with clear errors naming the file and block. Version-1 files
(tests/fixtures/golden/rowimage-v1.img, written by the version-1 writer) stay readable."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_state.format import datafile, tables
from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.format import keyfilter, rowimage, unsaferow
from tests.fixtures import make_keyfilter_vectors, make_rowimage_v1
from tests.fixtures.make_keyfilter_vectors import spec_bits, spec_filter


def spec_parse(data: bytes) -> tuple[dict, list[dict], list[list[tuple]]]:
    """Trailer, index, filter and every block's records, read as the spec describes them."""
    (index_offset, records, blocks, index_crc, codec, flags) = struct.unpack_from("<QQIIII", data, len(data) - 40)
    assert data[-8:-1] == b"SPKSTRI" and data[-1] in (1, 2, 3)
    version = data[-1]
    index_end = index_offset + 40 * blocks
    end = len(data) - 40   # where the trailer starts; the directory (version 3) and the filter come before it
    directory = None
    if flags & 4:
        assert version == 3
        pages, per_page, pages_crc, reserved = struct.unpack_from("<IIII", data, end - 16)
        assert reserved == 0 and per_page >= 1 and pages == -(-blocks // per_page)
        end -= 16 + 32 * pages
        assert zlib.crc32(struct.pack("<II", pages, per_page), zlib.crc32(data[end:end + 32 * pages])) == pages_crc
        directory = (per_page, [struct.unpack_from("<QQQII", data, end + 32 * p) for p in range(pages)])
    words = filter_at = None
    if flags & 2:
        assert version >= 2
        w, k, filter_crc, reserved = struct.unpack_from("<IIII", data, end - 16)
        assert reserved == 0 and 1 <= k <= 30 and index_end + 8 * w + 16 == end
        assert zlib.crc32(data[index_end:index_end + 8 * w]) == filter_crc
        words = (w, k, int.from_bytes(data[index_end:index_end + 8 * w], "little"))
        filter_at = end - 16
    else:
        assert index_end == end
    index = data[index_offset:index_end]
    assert zlib.crc32(index) == index_crc
    entries, parsed = [], []
    for b in range(blocks):
        first, last, offset, stored, raw, crc, count = struct.unpack_from("<QQQIIII", index, 40 * b)
        entries.append(dict(first=first, last=last, offset=offset, stored=stored, raw=raw, crc=crc, records=count))
        block = data[offset:offset + stored]
        assert zlib.crc32(block) == crc
        body = block if codec == 0 else zstandard.ZstdDecompressor().decompress(block)
        assert len(body) == raw
        recs, at = [], 0
        while at < raw:
            kg, h, klen, vlen = struct.unpack_from("<iiii", body, at)
            assert at % 8 == 0 and klen % 8 == 0 and (vlen == -1 or vlen % 8 == 0)
            key = body[at + 16:at + 16 + klen]
            value = None if vlen == -1 else body[at + 16 + klen:at + 16 + klen + vlen]
            recs.append((kg, h, key, value))
            at += 16 + klen + max(vlen, 0)
        assert at == raw and len(recs) == count
        parsed.append(recs)
    assert sum(e["records"] for e in entries) == records
    if directory is not None:   # each page names its entries' first and last keys, first offset, CRC, records
        per_page, pages = directory
        for p, (first, last, offset, crc, count) in enumerate(pages):
            mine = entries[p * per_page:(p + 1) * per_page]
            assert (first, last, offset) == (mine[0]["first"], mine[-1]["last"], mine[0]["offset"])
            assert crc == zlib.crc32(index[40 * p * per_page:40 * (p + 1) * per_page])
            assert count == sum(e["records"] for e in mine)
    if words is not None:   # every record's bits are set
        w, k, bits = words
        for kg, h, _, _ in (r for block in parsed for r in block):
            assert all(bits >> bit & 1 for bit in spec_bits(h, k, 64 * w))
    return dict(records=records, blocks=blocks, codec=codec, flags=flags, index_offset=index_offset,
                version=version, filter=words, filter_at=filter_at, pages=directory and len(directory[1])), \
        entries, parsed


def sk(kg: int, h: int) -> int:
    return (kg << 32) | (h & 0xFFFFFFFF)


def opaque_table(rows: list[tuple[int, int, bytes, bytes | None]]) -> pa.Table:
    return pa.table({"kg": pa.array([r[0] for r in rows], pa.int32()), "hash": pa.array([r[1] for r in rows], pa.int32()),
                     "key": pa.array([r[2] for r in rows], pa.binary()),
                     "value": pa.array([r[3] for r in rows], pa.binary())}, schema=tables.CHANGES_SCHEMA)


words = st.integers(0, 6).flatmap(lambda w: st.binary(min_size=8 * w, max_size=8 * w))


@st.composite
def opaque_rows(draw):
    """Distinct keys; few hashes and key groups, so sort keys collide; some tombstones, some big rows."""
    hashes = draw(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=1, max_size=5))
    keys = draw(st.lists(words, max_size=40, unique=True))
    rows = []
    for key in keys:
        h = draw(st.sampled_from(hashes))
        kg = draw(st.sampled_from([h % 7, h % 100800, 0, 2 ** 31 - 1]))
        big = draw(st.integers(0, 20)) == 0
        value = draw(st.none() | words) if not big else bytes(8 * draw(st.integers(100, 3000)))
        rows.append((kg, h, key, value))
    return rows


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=opaque_rows(), block_bytes=st.sampled_from([16, 40, 100, 512, 16384]), codec=st.sampled_from([0, 1]),
       per_page=st.sampled_from([1, 3, rowimage.PAGE_ENTRIES]))
def test_round_trip_and_lookups(rows, block_bytes, codec, per_page, monkeypatch):
    monkeypatch.setattr(rowimage, "PAGE_ENTRIES", per_page)   # index pages of one entry, three, the default
    img = rowimage.encode(opaque_table(rows), block_bytes=block_bytes, codec=codec)
    with monkeypatch.context() as m:   # chunks of a block or two, compressed on two threads: the same bytes
        m.setattr(rowimage, "CHUNK_BYTES", block_bytes)
        assert rowimage.encode(opaque_table(rows), block_bytes=block_bytes, codec=codec, threads=2).data == img.data
    assert img.checksum == datafile.crc32_hex(img.data) and img.size == len(img.data) and img.rows == len(rows)
    trailer, entries, blocks = spec_parse(img.data)
    assert trailer["codec"] == codec and trailer["flags"] == 2 | 4 | (1 if any(r[3] is None for r in rows) else 0)
    assert img.tombstones == bool(trailer["flags"] & 1) and img.blocks == trailer["blocks"]
    # version 3, a filter sized by the writers' rule, a directory of the index's pages; the sizes add up
    # (spec_parse checks where each sits)
    assert trailer["version"] == 3 and trailer["filter"][:2] == (max(1, -(-10 * len(rows) // 64)), 7)
    assert img.filter_words == trailer["filter"][0] and trailer["pages"] == -(-img.blocks // per_page)
    assert img.size == trailer["index_offset"] + 40 * img.blocks + 8 * img.filter_words + 16 \
        + 32 * trailer["pages"] + 16 + 40

    # every row once, in sort-key order; index entries match their blocks; greedy packing within the size
    flat = [r for block in blocks for r in block]
    assert sorted(flat, key=repr) == sorted(rows, key=repr)
    keys = [sk(kg, h) for kg, h, _, _ in flat]
    assert keys == sorted(keys)
    for e, block, nxt in zip(entries, blocks, blocks[1:] + [None]):
        assert e["first"] == sk(*block[0][:2]) and e["last"] == sk(*block[-1][:2])
        assert e["raw"] <= block_bytes or len(block) == 1
        if nxt is not None:   # the next record did not fit
            first_next = 16 + len(nxt[0][2]) + len(nxt[0][3] or b"")
            assert e["raw"] + first_next > block_bytes

    image = rowimage.RowImage(img.data, "img")
    assert list(image) == [rowimage.Record(*r) for r in flat]
    assert image.version == 3 and image.might_contain(np.array([r[1] for r in rows], np.int32)).all()
    for kg, h, key, value in rows:
        found = image.lookup(kg, h, key)
        assert (found is rowimage.DELETED) if value is None else (found == value)
    present = {(kg, h, key) for kg, h, key, _ in rows}
    for kg, h, key, _ in rows:   # the same hash with another key, or the key under another hash
        for probe in [(kg, h, key + bytes(8)), (kg, h ^ 1, key), (kg + 1, h, key)]:
            if probe not in present:
                assert image.lookup(*probe) is None


def test_an_empty_file_is_its_filter_of_one_word_its_empty_directory_and_its_trailer():
    img = rowimage.encode(opaque_table([]))
    assert img.size == 8 + 16 + 16 + 40 and img.blocks == 0 and img.rows == 0 and img.filter_words == 1
    assert img.data[:8] == bytes(8)
    image = rowimage.RowImage(img.data, "empty")
    assert list(image) == [] and image.lookup(0, 0, b"") is None and not image.might_contain(0)
    assert image.to_table().num_rows == 0


def test_a_huge_record_has_a_block_of_its_own():
    rows = [(1, 1, bytes(8), bytes(8)), (1, 2, bytes(16), bytes(8 * 200_000)), (1, 3, bytes(8), None)]
    img = rowimage.encode(opaque_table(rows))
    _, entries, blocks = spec_parse(img.data)
    assert [len(b) for b in blocks] == [1, 1, 1] and entries[1]["raw"] == 16 + 16 + 8 * 200_000
    assert rowimage.lookup(img.data, 1, 2, bytes(16)) == bytes(8 * 200_000)


def test_typed_rows_are_imaged_as_their_unsafe_rows():
    n = 3000
    h = np.random.default_rng(3).integers(-2 ** 31, 2 ** 31, n).astype(np.int32)
    kg = np.mod(h.astype(np.int64), 100800).astype(np.int32)
    key = pa.StructArray.from_arrays([pa.array([f"user-{i:08d}" for i in range(n)])], names=["user"])
    state = pa.StructArray.from_arrays([pa.array(np.arange(n)), pa.array([None if i % 5 else "x" for i in range(n)])],
                                       names=["clicks", "page"])
    value = pa.StructArray.from_arrays([state, pa.array(np.arange(n) * 10)], names=["groupState", "timeout"],
                                       mask=pa.array(np.arange(n) % 11 == 0))
    table = pa.table({"kg": kg, "hash": h, "key": key, "value": value})
    img = rowimage.encode(table, level=3)
    k_off, k_data = unsaferow.encode(key)
    v_off, v_data = unsaferow.encode(value)
    image = rowimage.RowImage(img.data, "typed")
    for i in range(0, n, 7):
        found = image.lookup(int(kg[i]), int(h[i]), k_data[k_off[i]:k_off[i + 1]].tobytes())
        if i % 11 == 0:
            assert found is rowimage.DELETED
        else:
            assert found == v_data[v_off[i]:v_off[i + 1]].tobytes()
    # the opaque table of the same rows images to the same bytes
    opaque = opaque_table([(int(kg[i]), int(h[i]), k_data[k_off[i]:k_off[i + 1]].tobytes(),
                            None if i % 11 == 0 else v_data[v_off[i]:v_off[i + 1]].tobytes()) for i in range(n)])
    assert rowimage.encode(opaque, level=3).data == img.data
    assert image.to_table().sort_by([("kg", "ascending"), ("hash", "ascending")]).equals(
        rowimage.RowImage(rowimage.encode(opaque).data, "o").to_table().sort_by([("kg", "ascending"), ("hash", "ascending")]))


def test_lookup_reads_the_index_and_one_block_by_byte_range():
    rows = [(i % 50, i, struct.pack("<q", i), bytes(64)) for i in range(2000)]
    img = rowimage.encode(opaque_table(rows), block_bytes=4096)
    read = []

    def fetch(ranges):
        read.extend(ranges)
        return [img.data[a:b] for a, b in ranges]

    image = rowimage.RowImage(fetch, "remote", size=img.size)
    opened = sum(b - a for a, b in read)
    assert opened == 40 + 16 + 40 * img.blocks + 8 * img.filter_words + 16 + 32
    assert image.lookup(7, 1007, struct.pack("<q", 1007)) == bytes(64)
    assert sum(b - a for a, b in read) - opened <= max(image.index["stored"])
    # absent keys the filter denies read no block
    before = len(read)
    absent = [h for h in range(10_000, 12_000) if not image.might_contain(h)]
    assert len(absent) > 1900
    assert all(image.lookup(h % 50, h, struct.pack("<q", h)) is None for h in absent) and len(read) == before
    with pytest.raises(ValueError, match="needs its size"):
        rowimage.RowImage(fetch, "remote")


# ------------------------------------------------------------------ corruption

SMALL_ROWS = [(i % 3, i * 7919, struct.pack("<q", i), bytes([i]) * 8 if i % 4 else None) for i in range(12)]


def small_image(codec: int = 0) -> bytes:
    return rowimage.encode(opaque_table(SMALL_ROWS), block_bytes=128, codec=codec).data


def read_all(data, name="state/x.img"):
    image = rowimage.RowImage(data, name)
    return list(image)


def test_every_single_bit_flip_is_caught():
    """A flipped bit anywhere fails with an error naming the file (the block for block bytes), except the
    trailer's tombstone flag, which only the manifest's whole-file CRC covers (as for every file), and the
    filter header's k, which no CRC covers: a k flipped lower only adds false positives (every lookup still
    finds its key), a k flipped higher is caught by the hashes the index names (or is out of range)."""
    for codec in (0, 1):
        data = small_image(codec)
        trailer, entries, _ = spec_parse(data)
        flags_bit0 = (len(data) - 40 + 28) * 8
        k_bits = range((trailer["filter_at"] + 4) * 8, (trailer["filter_at"] + 8) * 8)
        for bit in range(len(data) * 8):
            flipped = bytearray(data)
            flipped[bit // 8] ^= 1 << (bit % 8)
            if bit == flags_bit0:
                assert datafile.crc32_hex(bytes(flipped)) != datafile.crc32_hex(data)
                continue
            if bit in k_bits and bit - k_bits[0] < 3:   # 7 -> 6, 5 or 3
                image = rowimage.RowImage(bytes(flipped), "state/x.img")
                assert image.filter.k < 7
                for kg, h, key, value in SMALL_ROWS:
                    assert image.lookup(kg, h, key) == (rowimage.DELETED if value is None else value)
                continue
            with pytest.raises((ChecksumMismatch, FormatVersionError)) as err:
                read_all(bytes(flipped))
            assert "state/x.img" in str(err.value)
            if bit // 8 < trailer["index_offset"]:
                b = next(i for i, e in enumerate(entries) if e["offset"] <= bit // 8 < e["offset"] + e["stored"])
                assert f"block {b} " in str(err.value), str(err.value)


def test_truncated_and_padded_files_are_refused():
    data = small_image(1)
    for size in [0, 1, 39, 40, len(data) // 2, len(data) - 41, len(data) - 1]:
        with pytest.raises(ChecksumMismatch, match=r"row image state/x.img .*(truncated|trailer|magic|index)"):
            read_all(data[:size])
    with pytest.raises(ChecksumMismatch, match="magic"):
        read_all(data + bytes(8))
    with pytest.raises(ChecksumMismatch, match="index entries"):
        read_all(bytes(8) + data)


def test_bad_magic_and_newer_version():
    data = small_image()
    with pytest.raises(ChecksumMismatch, match="magic"):
        read_all(data[:-8] + b"SPKSTRX\x01")
    with pytest.raises(ChecksumMismatch, match="magic"):
        read_all(datafile.encode(tables.empty_table()).data)   # a snapshot is not a row image
    with pytest.raises(FormatVersionError, match="version 4.*upgrade spark_state"):
        read_all(data[:-1] + b"\x04")
    with pytest.raises(ChecksumMismatch, match="version 2, codec 0 and flags 0x7, which no writer made"):
        read_all(data[:-1] + b"\x02")   # version 2 has no directory
    with pytest.raises(ChecksumMismatch, match="version 1, codec 0 and flags 0x7, which no writer made"):
        read_all(data[:-1] + b"\x01")   # version 1 has no filter either


def test_a_damaged_filter_is_a_checksum_mismatch():
    """Every word bit is covered by the filter's CRC; W by the sizes; reserved must be 0; a k raised past
    the records' bits (without a bit flip's luck) by the hashes the index names."""
    data = small_image(1)
    trailer, entries, _ = spec_parse(data)
    w = trailer["filter"][0]
    words_at = trailer["index_offset"] + 40 * trailer["blocks"]
    header_at = trailer["filter_at"]
    for bit in range(words_at * 8, (words_at + 8 * w) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ChecksumMismatch, match="state/x.img has a key filter whose CRC-32 does not match"):
            read_all(bytes(flipped))
    for at, value, match in [(0, w + 1, "index entries"), (0, 0, "filter header of 0 words"),
                             (4, 0, "0 bits per key"), (4, 31, "31 bits per key"), (12, 1, "reserved 0x1"),
                             (4, 30, "denies a hash its block index names")]:
        damaged = bytearray(data)
        struct.pack_into("<I", damaged, header_at + at, value)
        with pytest.raises(ChecksumMismatch, match=match):
            read_all(bytes(damaged))
    # a filter whose words are zero but whose CRC matches (a writer bug, not bit rot): it denies its own keys
    damaged = bytearray(data)
    damaged[words_at:words_at + 8 * w] = bytes(8 * w)
    struct.pack_into("<I", damaged, header_at + 8, zlib.crc32(bytes(8 * w)))
    with pytest.raises(ChecksumMismatch, match="denies a hash its block index names"):
        read_all(bytes(damaged))


def test_a_block_with_a_valid_crc_but_wrong_records_is_refused():
    """A writer bug (not bit rot): the block's CRC matches, its records do not match its index entry."""
    rows = [(1, i, struct.pack("<q", i), bytes(8)) for i in range(4)]
    data = bytearray(rowimage.encode(opaque_table(rows), codec=0).data)
    trailer, entries, _ = spec_parse(bytes(data))
    struct.pack_into("<i", data, 12, 7)   # first record's valueLength: 8 -> 7
    block = bytes(data[:entries[0]["stored"]])
    index_at = trailer["index_offset"]
    struct.pack_into("<I", data, index_at + 32, zlib.crc32(block))
    index = bytes(data[index_at:index_at + 40 * len(entries)])
    struct.pack_into("<I", data, len(data) - 40 + 20, zlib.crc32(index))
    # and the directory's entry of the page, and the directory's CRC
    pages, per_page = struct.unpack_from("<II", data, len(data) - 56)
    directory = rowimage.page_directory(np.frombuffer(index, dtype=rowimage.INDEX_ENTRY), index, per_page).tobytes()
    directory_at = len(data) - 40 - 16 - len(directory)
    data[directory_at:directory_at + len(directory)] = directory
    struct.pack_into("<I", data, len(data) - 56 + 8,
                     zlib.crc32(struct.pack("<II", pages, per_page), zlib.crc32(directory)))
    with pytest.raises(ChecksumMismatch, match="block 0 with a record at byte 0"):
        read_all(bytes(data))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="not an UnsafeRow"):
        rowimage.encode(opaque_table([(0, 0, b"abc", b"")]))
    with pytest.raises(ValueError, match="negative"):
        rowimage.encode(opaque_table([(-1, 0, b"", b"")]))
    with pytest.raises(ValueError, match="appears twice"):
        rowimage.encode(opaque_table([(0, 5, bytes(8), b""), (0, 6, bytes(8), b""), (0, 5, bytes(8), None)]))
    with pytest.raises(ValueError, match="cannot be null"):
        rowimage.encode(opaque_table([(0, 0, None, b"")]))
    with pytest.raises(TypeError, match="tags"):
        rowimage.encode(pa.table({"kg": pa.array([0], pa.int32()), "hash": pa.array([0], pa.int32()),
                                  "key": pa.array([{"tags": ["a"]}]), "value": pa.array([{"x": 1}])}))


# ------------------------------------------------------------------ the key filter (format version 2)

int32s = st.integers(-2 ** 31, 2 ** 31 - 1)


@settings(max_examples=300, deadline=None)
@given(h=int32s, k=st.integers(1, 30),
       m=st.sampled_from([64, 128, 640, 10048, 1 << 20, 1 << 32, (1 << 32) + 64, 64 * (2 ** 32 - 1)])
       | st.integers(1, 2 ** 26).map(lambda w: 64 * w))
def test_filter_bits_follow_the_spec(h, k, m):
    """keyfilter's vectorised uint64 arithmetic gives the spec's bits (Python integers), wrapping included;
    unsigned and signed forms of a hash are one hash."""
    assert keyfilter.positions(np.array([h], np.int32), k, m)[0].tolist() == spec_bits(h, k, m)
    assert keyfilter.positions(h & 0xFFFFFFFF, k, m)[0].tolist() == spec_bits(h, k, m)


def test_the_test_vectors_are_the_spec_and_this_implementation_agrees():
    """tests/fixtures/rowimage/keyfilter-vectors.json (what the JVM's tests check too) is what the spec gives,
    and keyfilter computes every number in it: positions, whole filters' words and CRCs, probe answers."""
    path = make_keyfilter_vectors.OUT
    assert path.read_text() == make_keyfilter_vectors.dump(make_keyfilter_vectors.vectors())
    vectors = json.loads(path.read_text())
    for v in vectors["positions"]:
        assert keyfilter.positions(np.int32(v["hash"]), v["k"], v["m"])[0].tolist() == v["bits"]
    for f in vectors["filters"]:
        built = keyfilter.KeyFilter.of(np.array(f["hashes"], np.int32))
        assert (len(built.words), built.k) == (f["W"], f["k"]) == (keyfilter.words_for(f["records"]), 7)
        assert [f"{int(w):016x}" for w in built.words] == f["words"]
        assert zlib.crc32(built.to_bytes()) == f["crc32"]
        probes = np.array([p["hash"] for p in f["probes"]], np.int32)
        assert built.might_contain(probes).tolist() == [p["mayContain"] for p in f["probes"]]


@settings(max_examples=200, deadline=None)
@given(hashes=st.lists(int32s | st.sampled_from([0, -1, 7]), max_size=3000), parts=st.integers(1, 5),
       extra=st.integers(0, 500))
def test_a_filter_never_denies_a_hash_it_holds(hashes, parts, extra):
    """No false negative, whatever the hashes (repeats included) and however many records the filter is
    sized for; built in parts it is the same filter; its words are the spec's."""
    records = len(hashes) + extra
    whole = keyfilter.KeyFilter.of(np.array(hashes, np.int32), records)
    assert whole.might_contain(np.array(hashes, np.int32)).all()
    assert all(whole.might_contain(h) for h in hashes[:20])
    builder = keyfilter.FilterBuilder(records)
    for part in np.array_split(np.array(hashes, np.int32), parts):
        builder.add(part)
    assert np.array_equal(builder.finish().words, whole.words)
    if not extra:   # sized for exactly its hashes: the spec's words
        w, bits = spec_filter(hashes)
        assert len(whole.words) == w and int.from_bytes(whole.to_bytes(), "little") == bits


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1000, 50_000))
def test_absent_hashes_pass_the_filter_in_about_one_percent_of_cases(seed, n):
    """10 bits per key, 7 bits per hash: 0.82% in theory (measured over 300 filters: mean 0.819%, standard
    deviation 0.03%); never above 1% over 100,000 absent hashes."""
    rng = np.random.default_rng(seed)
    held = rng.integers(-2 ** 31, 2 ** 31, n).astype(np.int32)
    probes = rng.integers(-2 ** 31, 2 ** 31, 100_000).astype(np.int32)
    probes = probes[~np.isin(probes, held)]
    assert keyfilter.KeyFilter.of(held).might_contain(probes).mean() <= 0.01


def test_a_version_1_image_still_reads():
    """The version-1 writer's file (no filter, tombstones): every record is read and found, absent keys are
    absent, and nothing claims a filter."""
    from tests.unit.test_golden_layout import _typed_rows

    data = (make_rowimage_v1.OUT).read_bytes()
    assert data[-1] == 1
    image = rowimage.RowImage(data, "v1-typed.img")
    assert image.version == 1 and image.filter is None and image.tombstones and image.rows == 300
    assert image.might_contain(np.arange(-5, 5, dtype=np.int32)).all()
    # the same rows, written now: version 3, the same records in the same blocks
    now = rowimage.RowImage(rowimage.encode(_typed_rows(), block_bytes=make_rowimage_v1.BLOCK_BYTES).data, "now")
    assert now.version == 3 and list(image) == list(now)
    assert np.array_equal(image.index, now.index)
    for record in image:
        expected = rowimage.DELETED if record.value is None else record.value
        assert image.lookup(record.kg, record.hash, record.key) == expected
        assert image.lookup(record.kg, record.hash, record.key + bytes(8)) is None


# ------------------------------------------------------------------ written a range at a time

@settings(max_examples=150, deadline=None)
@given(rows=opaque_rows(), block_bytes=st.sampled_from([16, 40, 100, 512, 16384]), codec=st.sampled_from([0, 1]),
       cuts=st.lists(st.integers(0, 2 ** 31 - 1), max_size=4))
def test_an_image_written_range_by_range_is_the_image_of_all_its_rows(rows, block_bytes, codec, cuts):
    """ImageWriter given the rows a key-group range at a time (some ranges empty) writes the very bytes
    ``encode`` writes for all of them at once: blocks packed greedily across ranges, one index, one filter."""
    whole = rowimage.encode(opaque_table(rows), block_bytes=block_bytes, codec=codec)
    bounds = sorted(set(cuts) | {0, 2 ** 31})
    pieces = []
    writer = rowimage.ImageWriter(pieces.append, block_bytes=block_bytes, codec=codec)
    for lo, hi in zip(bounds, bounds[1:]):
        writer.add(opaque_table([r for r in rows if lo <= r[0] < hi]))
    done = writer.finish()
    assert b"".join(pieces) == whole.data
    assert (done.rows, done.size, done.checksum, done.blocks, done.tombstones, done.filter_words) == \
        (whole.rows, whole.size, whole.checksum, whole.blocks, whole.tombstones, whole.filter_words)


def test_ranges_added_out_of_order_are_refused():
    writer = rowimage.ImageWriter(lambda data: None)
    writer.add(opaque_table([(5, 1, bytes(8), bytes(8))]))
    with pytest.raises(ValueError, match="out of sort-key order"):
        writer.add(opaque_table([(4, 1, bytes(16), bytes(8))]))
