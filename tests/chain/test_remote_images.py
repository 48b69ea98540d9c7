"""Row images on remote storage read by byte range (issue 38), on the loopback S3 server: a lazy load names
the image by its path in the store with its tail (filter header, page directory, trailer) instead of
downloading it, the tail is read with the changes, in one round trip when the guess of the directory's size
holds (an image older than version 3 adds one for its whole index), and
every byte of the image can be fetched by range. Local checkpoints are read in place as before; a damaged
or missing tail costs only the laziness; ``rowImages.rangeReads=false`` downloads the image as before."""

from __future__ import annotations

import base64
import uuid
from dataclasses import replace

import pytest

from spark_state.errors import ChecksumMismatch, FileMissing, StorageError
from spark_state.format import manifest, rowimage
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from tests.chain.test_row_images import IMAGES, lazily, row_bytes, typed
from tests.support import s3_server
from tests.support.stores import store_on


@pytest.fixture(scope="module")
def bucket() -> str:
    s3_server.start()
    name = f"images-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(name)
    return name


def compacted_store(root: str, versions: int = 5, **settings):
    """A store with a row image under its newest version's chain, and the model of its state."""
    store = store_on(root, **{**IMAGES, "row_image_range_reads": True, **settings})
    model: dict[int, int] = {}
    for v in range(1, versions + 1):
        batch = {i: v * 10 + i for i in range(v * 3, v * 3 + 40)} | {v: None}
        store.commit(v, typed(batch))
        model.update(batch)
        store.maintenance(10, v)
    store.commit(versions + 1, typed({1000: 1, 3: None}))
    model.update({1000: 1, 3: None})
    return store, {i: x for i, x in model.items() if x is not None}


class Counting:
    """The store's storage, counting the round trips (read_ranges calls) made for one file."""

    def __init__(self, storage, path: str):
        self.storage, self.path, self.trips, self.ranges = storage, path, 0, []

    def __call__(self, ranges):
        self.trips += 1
        self.ranges += ranges
        return self.storage.read_ranges(self.path, ranges)


def as_version_2(data: bytes) -> bytes:
    """A version-3 image as the version-2 writer wrote it: the same bytes without the page directory."""
    pages = int.from_bytes(data[-56:-52], "little")
    trailer = bytearray(data[-40:])
    trailer[28] &= ~rowimage.PAGED
    trailer[39] = 2
    return data[:len(data) - 40 - 16 - 32 * pages] + bytes(trailer)


def reads_of(store, monkeypatch) -> list[str]:
    """The paths the store's storage reads by range from now on."""
    paths: list[str] = []
    read_ranges = store.storage.read_ranges
    monkeypatch.setattr(store.storage, "read_ranges", lambda path, r: paths.append(path) or read_ranges(path, r))
    return paths


def test_a_lazy_load_from_s3_names_the_image_with_its_tail_and_every_block_reads_by_range(bucket, tmp_path,
                                                                                        monkeypatch):
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    reads = reads_of(store, monkeypatch)
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    assert not [p for p in reads if p.endswith(".img")], "the tail came with the manifest (format 6)"
    image = loaded.image
    assert image is not None and image.remote and image.path is None
    assert not (tmp_path / "cache").exists(), "nothing was downloaded"
    assert image.file.startswith("shared/") and image.file.endswith(".img")
    whole = store.storage.read_file(image.file)
    assert len(whole) == image.size
    # the tail is the file's last bytes: filter header, page directory (one page here) and its header, trailer
    ((end_start, end),) = image.tail.ranges
    assert end == image.size and image.tail.data == (whole[end_start:end],)
    assert end - end_start == 16 + 32 + 16 + 40 and image.tail.blocks > 0 and image.tail.filter_words > 0
    # the blocks, by range through the store (what the shim's fetch requests ask for), make the same file
    ranges = [(0, end_start), (end_start, image.size)]
    assert b"".join(store.reader.fetch(image.file, ranges)) == whole
    parsed = rowimage.RowImage(whole, image.file)
    state = {r.key: r.value for r in parsed}
    for k, v in row_bytes(loaded.table).items():
        state.pop(k, None) if v is None else state.__setitem__(k, v)
    assert state == row_bytes(typed(live)) == row_bytes(store.load(6))
    chain = store.reader.view(6).chain
    assert loaded.bytes_read == sum(f.size for f in chain[1:]), "the changes' files (the tail was in the manifest)"
    assert store.reader.view(6).manifest.format == 6 and chain[0].image.tail_bytes == image.tail.data[0]


def test_a_deferred_load_names_the_image_at_once_and_reads_its_changes_in_the_background(bucket, tmp_path):
    """``defer``: the same image and the same changes, the changes from ``Loaded.deferred``; the chain's files stay
    pinned (retention leaves them alone) until that read is done."""
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    now = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    later = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True, defer=True)
    assert later.table is None and later.deferred is not None and later.bytes_read == 0
    assert later.image == now.image and later.commit_id == now.commit_id and later.keys == now.keys
    table, read = later.deferred.result(30)
    assert row_bytes(table) == row_bytes(now.table) and read == now.bytes_read
    assert later.deferred.rows >= table.num_rows
    assert not store.reader.ctx.locks.pinned(), "the deferred read unpinned the chain"
    # the changes of that commit over that image, read again (a new worker, which has no token)
    table, read = store.reader.changes_after(6, now.commit_id, now.image.file)
    assert row_bytes(table) == row_bytes(now.table) and not store.reader.ctx.locks.pinned()
    # a version with nothing after its image is not deferred
    assert store.load_lazy(5, cache_dir=str(tmp_path / "cache"), ranges=True, defer=True).deferred is None


def test_a_tail_in_the_manifest_that_does_not_parse_costs_only_a_request(bucket, tmp_path, monkeypatch, caplog):
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    entry = store.reader.view(6).chain[0].image
    broken = replace(entry, tail=base64.b64encode(entry.tail_bytes[:-1] + b"?").decode())
    reads = reads_of(store, monkeypatch)
    image = store.reader._image_tail(broken)
    assert image is not None and image.tail.data == (entry.tail_bytes,) and image.tail_read == len(entry.tail_bytes)
    assert reads == [entry.path] and "holds a tail that cannot be used" in caplog.text


def test_the_tail_is_a_few_hundred_bytes_at_any_size_in_one_round_trip():
    """Version 3: the tail is the page directory and the headers (32 bytes per 1,024 blocks), not the index,
    read in one round trip: 1,000 keys or 200,000, the row count exact or too high."""
    store = store_on(f"memory://{uuid.uuid4().hex}", **IMAGES)
    sizes = {}
    for n in (1_000, 200_000):
        encoded = rowimage.encode(typed({i: (i * 0x9E3779B97F4A7C15) % 2**63 for i in range(n)}))
        store.storage.write_file(f"shared/{n}.img", encoded.data)
        for rows in (encoded.rows, encoded.rows + 10_000):
            fetch = Counting(store.storage, f"shared/{n}.img")
            tail = rowimage.read_tail(fetch, f"{n}.img", encoded.size, rows)
            assert fetch.trips == 1 and tail.blocks == encoded.blocks
            pages = -(-encoded.blocks // rowimage.PAGE_ENTRIES)
            assert tail.size == 16 + 32 * pages + 16 + 40 and tail.data == (encoded.data[-tail.size:],)
        sizes[n] = (tail.size, encoded.size)
    assert sizes[200_000][1] > 100 * sizes[1_000][1] and sizes[200_000][0] <= sizes[1_000][0] + 32 * 4, sizes


def test_many_small_pages_cost_a_second_round_trip_for_the_directory(monkeypatch):
    """Pages of one entry, more than the guess allows: the directory is read exactly, once more."""
    monkeypatch.setattr(rowimage, "PAGE_ENTRIES", 1)
    store = store_on(f"memory://{uuid.uuid4().hex}", **IMAGES)
    encoded = rowimage.encode(typed({i: i for i in range(3000)}), block_bytes=256)
    store.storage.write_file("shared/tiny.img", encoded.data)
    fetch = Counting(store.storage, "shared/tiny.img")
    tail = rowimage.read_tail(fetch, "tiny.img", encoded.size, 1)
    assert fetch.trips == 2 and tail.blocks == encoded.blocks
    assert tail.data == (encoded.data[-(16 + 32 * encoded.blocks + 16 + 40):],)


@pytest.mark.parametrize("rows_off", [0, 10_000])
def test_a_version_2_image_reads_its_whole_index_in_pieces_in_a_second_round_trip(monkeypatch, rows_off):
    """An image written before version 3 has no directory: after the trailer, its whole index, in pieces of at
    most TAIL_RANGE_BYTES read at once; the tail is what the version-2 reader expects (index, then the end)."""
    store = store_on(f"memory://{uuid.uuid4().hex}", **IMAGES)
    encoded = rowimage.encode(typed({i: (i * 0x9E3779B97F4A7C15) % 2**63 for i in range(20_000)}))
    data = as_version_2(encoded.data)
    assert rowimage.RowImage(data, "v2").version == 2
    store.storage.write_file("shared/large.img", data)
    monkeypatch.setattr(rowimage, "TAIL_RANGE_BYTES", 1024)
    fetch = Counting(store.storage, "shared/large.img")
    tail = rowimage.read_tail(fetch, "large.img", len(data), encoded.rows + rows_off)
    assert fetch.trips == 2 and tail.blocks == encoded.blocks
    (index_start, index_end), (end_start, end) = tail.ranges
    assert end == len(data) and end - end_start == 16 + 40 and index_end == index_start + 40 * encoded.blocks
    assert tail.data == (data[index_start:index_end], data[end_start:end])
    pieces = [r for r in fetch.ranges if r[1] <= index_end]
    assert len(pieces) > 3 and max(b - a for a, b in pieces) <= 1024, fetch.ranges


def test_a_damaged_or_missing_remote_image_costs_only_the_laziness(bucket, tmp_path, monkeypatch):
    """An image whose entry holds no tail (a large one, or written before format 6) and whose own tail fails its
    checks (here the page directory's CRC): the rows are loaded instead. (With the tail in its entry, the load
    reads no byte of the image: a block damaged or gone fails the read that needs it, as damage, and the next
    load reads rows: tests/jvm/test_remote_images.py.)"""
    monkeypatch.setattr(manifest, "INLINE_TAIL_MAX", 0)
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    assert store.reader.view(6).chain[0].image.tail is None
    path = store.reader.view(6).chain[0].image.path
    whole = bytearray(store.storage.read_file(path))
    whole[-40 - 16 - 32 + 5] ^= 0xFF   # inside the page directory: its CRC fails
    store.storage.write_file(path, bytes(whole))
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    assert loaded.image is None and row_bytes(loaded.table) == row_bytes(typed(live))
    store.storage.delete_files([path])
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    assert loaded.image is None and row_bytes(loaded.table) == row_bytes(typed(live))


def test_fetching_past_the_end_of_the_image_or_a_gone_one_is_damage_while_a_version_names_it(bucket):
    """Damage: the shim stops reading images of the store and loads rows. A file no version names any more
    (retention dropped it under a store that still read it) is a failed read instead: the task's retry loads
    the version again, with its own image."""
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    entry = store.reader.view(6).chain[0].image
    with pytest.raises(ChecksumMismatch, match="shorter than the manifest"):
        store.reader.fetch(entry.path, [(0, 10), (entry.size - 5, entry.size + 5)])
    # a truncated image: S3 answers a range that starts past the object's end with 416, not fewer bytes
    full = store.storage.read_file(entry.path)
    store.storage.write_file(entry.path, full[:entry.size // 2])
    assert [len(c) for c in store.reader.fetch(entry.path, [(0, 10)])] == [10]
    with pytest.raises(ChecksumMismatch, match="shorter than the manifest"):
        store.reader.fetch(entry.path, [(0, 10), (entry.size - 100, entry.size)])
    with pytest.raises(ChecksumMismatch, match="shorter than the manifest"):
        store.reader.fetch(entry.path, [(entry.size - 100, entry.size)])
    store.storage.delete_files([entry.path])
    with pytest.raises(ChecksumMismatch, match="is missing"):
        store.reader.fetch(entry.path, [(0, 10)])
    with pytest.raises(FileMissing) as gone:
        store.reader.fetch("shared/v0000000001-image-0000000000000000.img", [(0, 10)])
    assert not isinstance(gone.value, ChecksumMismatch)


def test_range_reads_off_downloads_and_local_checkpoints_are_read_in_place(bucket, tmp_path):
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}", row_image_range_reads=False)
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    assert loaded.image is not None and not loaded.image.remote and loaded.image.temporary
    assert loaded.image.path.startswith(str(tmp_path / "cache"))
    local, live = compacted_store(f"file://{tmp_path}/local")
    loaded = local.load_lazy(6, cache_dir=str(tmp_path / "cache2"), ranges=True)
    assert not loaded.image.remote and not loaded.image.temporary
    assert loaded.image.path.startswith(str(tmp_path / "local"))
    assert lazily(local, 6, tmp_path / "cache2") == row_bytes(typed(live))


def test_auto_reads_by_range_from_the_minimum_size_and_downloads_smaller_images(bucket, tmp_path):
    """The default, ``rowImages.rangeReads=auto``: an image of ``rowImages.rangeReadsMinSize`` bytes or more is
    read by range, a smaller one downloaded (a download is faster for small images, docs/large-state.md)."""
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}", row_image_range_reads="auto")
    size = store.reader.view(6).chain[0].image.size
    assert store.ctx.settings.row_image_range_reads_min_size > size, "the test image must be small"
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "small"), ranges=True)
    assert not loaded.image.remote and loaded.image.temporary, "below the minimum size: downloaded"
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}", row_image_range_reads="auto",
                                  row_image_range_reads_min_size=size)
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "large"), ranges=True)
    assert loaded.image.remote and loaded.image.size == size and loaded.image.tail is not None, "at it: by range"
    assert not (tmp_path / "large").exists() or not list((tmp_path / "large").iterdir()), "nothing downloaded"
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}", row_image_range_reads="auto",
                               row_image_range_reads_min_size=size + 1)
    assert not store.load_lazy(6, cache_dir=str(tmp_path / "above"), ranges=True).image.remote


def test_a_download_whose_load_fails_is_deleted(bucket, tmp_path):
    """A load that downloaded the image, then could not read a change after it (a delta gone): the copy, as big
    as the snapshot, does not stay in the worker's directory (each of Spark's retries would add one)."""
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}", row_image_range_reads=False)
    chain = store.reader.view(6).chain
    assert chain[0].image is not None and len(chain) > 1
    store.storage.delete_files([chain[-1].path])
    cache = tmp_path / "cache"
    with pytest.raises(StorageError):
        store.load_lazy(6, cache_dir=str(cache), ranges=True)
    assert cache.is_dir() and not list(cache.iterdir()), list(cache.iterdir())


def test_a_remote_load_reads_manifest_and_compaction_record_at_once(bucket):
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    storage: FileSystemCheckpointStorage = store.storage
    manifest, record = storage.read_version(5)   # compacted: it has both
    assert manifest == storage.read_manifest(5) and record == storage.read_record(5, "_snapshot") is not None
    assert storage.read_version(6) == (storage.read_manifest(6), None)
