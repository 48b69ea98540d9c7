"""Row images on remote storage read by byte range (issue 38), on the loopback S3 server: a lazy load names
the image by its path in the store with its tail (index, filter header, trailer) instead of downloading it,
the tail is read with the changes, in one round trip when the guess of where the index starts holds, and
every byte of the image can be fetched by range. Local checkpoints are read in place as before; a damaged
or missing tail costs only the laziness; ``rowImages.rangeReads=false`` downloads the image as before."""

from __future__ import annotations

import uuid

import pytest

from spark_state.errors import ChecksumMismatch, StorageError
from spark_state.format import rowimage
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


def test_a_lazy_load_from_s3_names_the_image_with_its_tail_and_every_block_reads_by_range(bucket, tmp_path):
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    image = loaded.image
    assert image is not None and image.remote and image.path is None
    assert not (tmp_path / "cache").exists(), "nothing was downloaded"
    assert image.file.startswith("shared/") and image.file.endswith(".img")
    whole = store.storage.read_file(image.file)
    assert len(whole) == image.size
    (index_start, index_end), (end_start, end) = image.tail.ranges
    assert end == image.size and image.tail.data == (whole[index_start:index_end], whole[end_start:end])
    assert image.tail.blocks * 40 == index_end - index_start and image.tail.filter_words > 0
    # the blocks, by range through the store (what the shim's fetch requests ask for), make the same file
    ranges = [(0, index_start), (index_start, image.size)]
    assert b"".join(store.reader.fetch(image.file, ranges)) == whole
    parsed = rowimage.RowImage(whole, image.file)
    state = {r.key: r.value for r in parsed}
    for k, v in row_bytes(loaded.table).items():
        state.pop(k, None) if v is None else state.__setitem__(k, v)
    assert state == row_bytes(typed(live)) == row_bytes(store.load(6))
    chain = store.reader.view(6).chain
    assert loaded.bytes_read == image.tail.size + sum(f.size for f in chain[1:]), "the tail and the changes' files"


def test_the_tail_takes_one_round_trip_and_a_second_when_the_guess_misses(bucket):
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    entry = store.reader.view(6).chain[0].image
    whole = store.storage.read_file(entry.path)
    fetch = Counting(store.storage, entry.path)
    tail = rowimage.read_tail(fetch, entry.path, entry.size, entry.rows)
    assert fetch.trips == 1 and tail.blocks == rowimage.RowImage(whole, entry.path).blocks
    # a row count that is not the file's puts the guessed filter elsewhere: the index is read exactly, once more
    fetch = Counting(store.storage, entry.path)
    assert rowimage.read_tail(fetch, entry.path, entry.size, entry.rows + 10_000) == tail and fetch.trips == 2


@pytest.mark.parametrize("rows_off", [0, 10_000])
def test_a_large_index_is_asked_for_in_pieces_in_the_same_round_trips(monkeypatch, rows_off):
    """An index larger than TAIL_RANGE_BYTES (8 MB at 10M keys) is asked for in pieces of at most that, read at
    once in the one round trip (two when the guess of where it starts misses): the same tail as in one piece."""
    store = store_on(f"memory://{uuid.uuid4().hex}", **IMAGES)
    encoded = rowimage.encode(typed({i: (i * 0x9E3779B97F4A7C15) % 2**63 for i in range(20_000)}))
    store.storage.write_file("shared/large.img", encoded.data)
    one_piece = rowimage.read_tail(Counting(store.storage, "shared/large.img"), "large.img", encoded.size,
                                   encoded.rows + rows_off)
    monkeypatch.setattr(rowimage, "TAIL_RANGE_BYTES", 1024)
    fetch = Counting(store.storage, "shared/large.img")
    assert rowimage.read_tail(fetch, "large.img", encoded.size, encoded.rows + rows_off) == one_piece
    assert fetch.trips == (1 if rows_off == 0 else 2)
    index_start, index_end = one_piece.ranges[0]
    assert index_end - index_start > 3 * 1024
    pieces = [r for r in fetch.ranges if r[1] <= index_end]
    assert len(pieces) > 3 and max(b - a for a, b in pieces) <= 1024, fetch.ranges


def test_tiny_blocks_cost_a_second_round_trip_for_the_index(tmp_path):
    """Blocks of 64 bytes (one record each): more index entries than the guess allows, read exactly."""
    store = store_on(f"memory://{uuid.uuid4().hex}", **IMAGES)
    table = typed({i: i for i in range(300)})
    encoded = rowimage.encode(table, block_bytes=64)
    store.storage.write_file("shared/tiny.img", encoded.data)
    fetch = Counting(store.storage, "shared/tiny.img")
    tail = rowimage.read_tail(fetch, "tiny.img", encoded.size, encoded.rows)
    assert fetch.trips == 2 and tail.blocks == encoded.blocks
    index_start, index_end = tail.ranges[0]
    assert tail.data[0] == encoded.data[index_start:index_end]


def test_a_damaged_or_missing_remote_image_costs_only_the_laziness(bucket, tmp_path):
    store, live = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    path = store.reader.view(6).chain[0].image.path
    whole = bytearray(store.storage.read_file(path))
    index_offset = int.from_bytes(whole[-40:-32], "little")
    whole[index_offset + 5] ^= 0xFF   # inside the index: its CRC fails
    store.storage.write_file(path, bytes(whole))
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    assert loaded.image is None and row_bytes(loaded.table) == row_bytes(typed(live))
    store.storage.delete_files([path])
    loaded = store.load_lazy(6, cache_dir=str(tmp_path / "cache"), ranges=True)
    assert loaded.image is None and row_bytes(loaded.table) == row_bytes(typed(live))


def test_fetching_past_the_end_of_the_image_is_a_storage_error(bucket):
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    entry = store.reader.view(6).chain[0].image
    with pytest.raises(StorageError, match="shorter than the manifest"):
        store.reader.fetch(entry.path, [(0, 10), (entry.size - 5, entry.size + 5)])


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


def test_a_remote_load_reads_manifest_and_compaction_record_at_once(bucket):
    store, _ = compacted_store(f"s3://{bucket}/{uuid.uuid4().hex}")
    storage: FileSystemCheckpointStorage = store.storage
    manifest, record = storage.read_version(5)   # compacted: it has both
    assert manifest == storage.read_manifest(5) and record == storage.read_record(5, "_snapshot") is not None
    assert storage.read_version(6) == (storage.read_manifest(6), None)
