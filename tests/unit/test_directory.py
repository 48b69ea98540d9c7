"""The directory the lifecycle tools read and write (spark_state.storage.directory.Dir), on a local disk and on an
fsspec memory filesystem: whole-file writes replace a file atomically and drop its stale Hadoop ``.crc``
companion, reads of what is missing are empty rather than errors, and a location that is no URL is a clear
error."""

from __future__ import annotations

import os
import uuid

import pytest

from spark_state.errors import StorageError
from spark_state.storage.directory import Dir, crc_companion
from spark_state.storage.urls import as_url


@pytest.fixture(params=["local", "memory"])
def directory(request, tmp_path):
    if request.param == "local":
        yield Dir(str(tmp_path / "ckpt"))
        return
    url = f"memory://{uuid.uuid4().hex}/ckpt"
    yield Dir(url)
    d = Dir(url)
    if d.exists():
        d.fs.rm(d.base, recursive=True)


def test_crc_companion_is_hadoops_name():
    assert crc_companion("offsets/7") == "offsets/.7.crc"
    assert crc_companion("metadata") == ".metadata.crc"


def test_as_url_makes_local_paths_absolute_file_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert as_url("ckpt") == as_url(str(tmp_path / "ckpt")) == as_url(f"file://{tmp_path}/ckpt/")
    assert as_url("ckpt").startswith("file://") and as_url("ckpt").endswith(f"{tmp_path}/ckpt")
    assert as_url("s3://bucket/ckpt/") == "s3://bucket/ckpt"
    with pytest.raises(StorageError, match="empty location"):
        as_url("  ")


def test_an_unknown_url_scheme_is_a_clear_error():
    with pytest.raises(StorageError, match="Use a URL fsspec knows"):
        Dir("nosuchscheme://bucket/ckpt")


def test_a_missing_directory_reads_as_empty(directory):
    assert not directory.exists()
    assert directory.is_empty()
    assert directory.listdir() == [] and directory.listdir("offsets") == []
    assert directory.files() == {} and directory.files("state/0") == {}
    with pytest.raises(FileNotFoundError):
        directory.read("metadata")
    directory.delete("offsets/0")   # nothing to delete is no error


def test_empty_subdirectories_are_nothing(directory):
    directory.write("state/0/0/chk-1/_metadata", b"m")
    directory.delete("state/0/0/chk-1/_metadata")
    assert directory.is_empty()
    directory.write("offsets/0", b"v1\n")
    assert not directory.is_empty()


def test_write_read_list_and_sizes(directory):
    directory.write("offsets/0", b"v1\n{}")
    directory.write("offsets/1", b"v1\n{}\n-")
    directory.write("metadata", b'{"id":"q"}')
    assert directory.read("offsets/1") == b"v1\n{}\n-"
    assert directory.size("offsets/1") == 7
    assert directory.listdir() == ["metadata", "offsets"]
    assert directory.listdir("offsets") == ["0", "1"]
    assert directory.files() == {"metadata": 10, "offsets/0": 5, "offsets/1": 7}
    assert directory.files("offsets") == {"offsets/0": 5, "offsets/1": 7}, "paths stay relative to the directory"
    child = directory.child("offsets")
    assert child.read("0") == b"v1\n{}" and child.url_of("0") == directory.url_of("offsets/0")


def test_a_rewrite_replaces_the_file_and_drops_its_stale_crc(directory):
    directory.write("offsets/3", b"old")
    directory.copy_in("offsets/.3.crc", b"checksum of old")
    directory.copy_in("offsets/.2.crc", b"checksum of another file")
    directory.write("offsets/3", b"new")
    assert directory.read("offsets/3") == b"new"
    assert not directory.exists("offsets/.3.crc"), "Hadoop would verify the new file against the old checksum"
    assert directory.exists("offsets/.2.crc"), "only the rewritten file's companion goes"
    assert directory.listdir("offsets") == [".2.crc", "3"], "no temporary file is left behind"


def test_a_local_rewrite_that_fails_keeps_the_old_file_whole_and_leaves_no_temp_file(tmp_path, monkeypatch):
    directory = Dir(str(tmp_path / "ckpt"))
    directory.write("commits/4", b"v1\nold")

    def replace_fails(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace_fails)
    monkeypatch.setattr(os, "rename", replace_fails)
    with pytest.raises(OSError, match="No space left"):
        directory.write("commits/4", b"v1\nnew")
    monkeypatch.undo()
    assert directory.read("commits/4") == b"v1\nold"
    assert directory.listdir("commits") == ["4"]


def test_copy_in_creates_parents(directory):
    directory.copy_in("state/0/1/chk-2/_metadata", b"manifest")
    assert directory.files("state") == {"state/0/1/chk-2/_metadata": 8}
