"""The records that make a version visible (spark_state.format.manifest): a manifest and a compaction record read
back as written, verify their own checksum, carry the lowest format a reader needs, and refuse a newer
format with FormatVersionError. (Their exact bytes: tests/unit/test_golden_layout.py; the store's use of
them: tests/chain/.)"""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from spark_state.chain import VersionedStore
from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.format.manifest import (
    DELTA, INLINE_TAIL_MAX, NEWEST_MANIFEST_FORMAT, SNAPSHOT, CompactionRecord, FileEntry, ImageEntry, Manifest, ManifestFormat, _body_crc,
    format_of,
)
from spark_state.options import Settings
from spark_state.storage.filesystem import FileSystemCheckpointStorage
from tests.support.changes import M, changes


def entry(version: int, kind: str = DELTA, **extra) -> FileEntry:
    return FileEntry(path=f"shared/v{version:010d}-{kind}-ab.arrow", kind=kind, version=version, size=100 + version,
                     checksum="crc32:0000abcd", rows=version, index_offset=10, index_length=20,
                     index_checksum="crc32:00001234", **extra)


SLICE = dict(partition=1, modulus=4, residue=3)
IMAGE = ImageEntry(path="shared/v0000000001-image-cd.img", size=4096, checksum="crc32:0000beef", rows=1)

entries = st.builds(entry, st.integers(0, 10**9), st.sampled_from([SNAPSHOT, DELTA]),
                    partition=st.none() | st.integers(0, 200), modulus=st.none() | st.integers(1, 200),
                    residue=st.none() | st.integers(0, 199), file_format=st.sampled_from([1, 2]),
                    image=st.none() | st.builds(ImageEntry, st.just("shared/v0000000001-image-cd.img"),
                                                st.integers(0, 10**12), st.just("crc32:0000beef"),
                                                st.integers(0, 10**9),
                                                st.none() | st.binary(max_size=64).map(
                                                    lambda b: base64.b64encode(b).decode())))


@given(st.lists(entries, max_size=5), st.none() | st.integers(0, 10**6), st.none() | st.text(max_size=36))
def test_a_manifest_reads_back_as_written(files, rows, query_id):
    manifest = Manifest(version=7, max_parallelism=16, files=tuple(files), rows=rows, query_id=query_id)
    assert Manifest.from_json(manifest.to_json(), "m") == manifest


def test_a_compaction_record_reads_back_as_written():
    record = CompactionRecord(version=9, commit_id="c0ffee", snapshot=entry(9, SNAPSHOT))
    assert CompactionRecord.from_json(record.to_json(), "r") == record
    assert record.format == ManifestFormat.PLAIN


def test_the_format_is_the_lowest_a_reader_needs():
    assert format_of([]) == ManifestFormat.PLAIN
    assert format_of([entry(1, SNAPSHOT), entry(2)]) == ManifestFormat.PLAIN
    assert format_of([entry(1, SNAPSHOT, **SLICE), entry(2)]) == ManifestFormat.SLICED
    assert format_of([entry(1, SNAPSHOT, **SLICE), entry(2, file_format=2)]) == ManifestFormat.TYPED
    assert format_of([entry(1, SNAPSHOT, file_format=2, image=IMAGE), entry(2, file_format=2)]) \
        == ManifestFormat.IMAGED
    tailed = replace(IMAGE, tail=base64.b64encode(b"tail").decode())
    assert format_of([entry(1, SNAPSHOT, file_format=2, image=tailed), entry(2, file_format=2)]) \
        == ManifestFormat.TAILED == NEWEST_MANIFEST_FORMAT
    assert Manifest(version=2, max_parallelism=16, files=(entry(1, SNAPSHOT),), rows=1).format == ManifestFormat.PLAIN


def test_a_plain_entry_writes_no_slice_or_file_format_fields():
    """Format-2 readers (earlier releases) read these manifests: nothing they do not know may appear."""
    plain = json.loads(Manifest(version=1, max_parallelism=16, files=(entry(1, SNAPSHOT),), rows=1).to_json())
    assert set(plain["files"][0]) == {"path", "kind", "version", "size", "checksum", "rows", "index_offset",
                                      "index_length", "index_checksum"}
    sliced = json.loads(Manifest(version=1, max_parallelism=16, files=(entry(1, SNAPSHOT, **SLICE),), rows=1).to_json())
    assert {"partition", "modulus", "residue"} <= set(sliced["files"][0])


def test_only_this_stores_files_are_its_paths():
    manifest = Manifest(version=3, max_parallelism=16, rows=None,
                        files=(entry(1, SNAPSHOT, **SLICE), entry(2), entry(3, modulus=2, residue=0)))
    assert manifest.paths == [entry(2).path, entry(3).path]
    assert manifest.deltas_since_snapshot == 2


def test_a_snapshots_row_image_is_one_of_its_stores_paths():
    """Retention, savepoints and validate go by a manifest's paths: an image must be among them."""
    manifest = Manifest(version=3, max_parallelism=16, rows=None, files=(entry(1, SNAPSHOT, image=IMAGE), entry(2)))
    assert manifest.paths == [entry(1, SNAPSHOT).path, IMAGE.path, entry(2).path]
    assert json.loads(manifest.to_json())["files"][0]["image"] == {"path": IMAGE.path, "size": 4096,
                                                                   "checksum": "crc32:0000beef", "rows": 1}
    assert "image" not in json.loads(manifest.to_json())["files"][1]


@pytest.mark.parametrize("edit", [
    lambda body: body.update(rows=body["rows"] + 1),
    lambda body: body["files"][0].update(size=1),
    lambda body: body.pop("checksum"),
])
def test_an_edited_manifest_fails_its_checksum(edit):
    body = json.loads(Manifest(version=4, max_parallelism=16, files=(entry(4, SNAPSHOT),), rows=4).to_json())
    edit(body)
    with pytest.raises(ChecksumMismatch, match="manifest chk-4/_metadata does not match its own checksum"):
        Manifest.from_json(json.dumps(body).encode(), "chk-4/_metadata")


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"version": 1}', b"\x00\x01"])
def test_a_torn_or_foreign_record_is_a_checksum_mismatch(data):
    with pytest.raises(ChecksumMismatch, match="corrupted or truncated"):
        Manifest.from_json(data, "chk-1/_metadata")
    with pytest.raises(ChecksumMismatch, match="corrupted or truncated"):
        CompactionRecord.from_json(data, "chk-1/_snapshot")


def test_a_record_with_unknown_fields_is_refused_by_name():
    body = json.loads(Manifest(version=1, max_parallelism=16, files=(), rows=0).to_json())
    body.pop("checksum")
    body["surprise"] = 1
    body["checksum"] = _body_crc(body)   # well formed, as a newer writer could make it
    with pytest.raises(ChecksumMismatch, match="manifest m has unexpected fields"):
        Manifest.from_json(json.dumps(body).encode(), "m")


@pytest.mark.parametrize("fmt", [NEWEST_MANIFEST_FORMAT + 1, 99, "4"])
def test_a_newer_or_unknown_format_is_refused_before_anything_is_read(fmt):
    body = json.loads(CompactionRecord(version=2, commit_id="c", snapshot=entry(2, SNAPSHOT)).to_json())
    body["format"] = fmt
    with pytest.raises(FormatVersionError, match=f"format version {fmt}, newer than the {NEWEST_MANIFEST_FORMAT}"):
        CompactionRecord.from_json(json.dumps(body).encode(), "chk-2/_snapshot")


def test_newer_manifest_format_is_refused(tmp_path):
    fs_store = VersionedStore(FileSystemCheckpointStorage(f"file://{tmp_path}/s"), Settings(max_parallelism=M))
    fs_store.commit(1, changes({b"k1": b"a"}))
    path = tmp_path / "s" / "chk-1" / "_metadata"
    body = json.loads(path.read_bytes())
    body["format"] = 99
    path.write_text(json.dumps(body))
    with pytest.raises(FormatVersionError, match="format version 99"):
        fs_store.load(1)


def test_an_image_entry_holds_its_images_tail_up_to_the_limit_and_is_written_at_format_6_only_then():
    """The tail rides in the entry (a restore by range needs no request for it) when small; a format-5 reader
    (the previous release) never meets an entry without one in a new format, nor a tail field."""
    written = rowimage_written(b"x" * 100)
    assert ImageEntry.written("shared/i.img", written).tail_bytes == b"x" * 100
    big = rowimage_written(b"x" * (INLINE_TAIL_MAX + 1))
    assert ImageEntry.written("shared/i.img", big).tail is None and ImageEntry.written("shared/i.img", big).tail_bytes == b""
    untailed = json.loads(Manifest(version=1, max_parallelism=16, files=(entry(1, SNAPSHOT, image=IMAGE),), rows=1)
                          .to_json())
    assert untailed["format"] == ManifestFormat.IMAGED and "tail" not in untailed["files"][0]["image"]
    assert replace(IMAGE, tail="not base64!").tail_bytes == b""   # then the tail is read from the file


def rowimage_written(tail: bytes):
    from spark_state.format.rowimage import WrittenImage
    return WrittenImage(rows=1, size=4096, checksum="crc32:0000beef", blocks=1, tombstones=False, filter_words=0,
                        tail=tail)
