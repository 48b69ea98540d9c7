"""A commit on a full or read-only filesystem: a StorageError naming the file, nothing half-visible (the
next load returns the previous version exactly, no stray file is named by anything), and the store
commits again once space or write permission returns.

The full disk is a real tmpfs of 256 KiB (needs root: mount); the read-only one a real read-only remount
of it (root) or, for a user that cannot mount, a directory without write permission (chmod: root ignores
it). Where neither works, the tests skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spark_state.errors import StorageError
from tests.support.changes import M, as_dict, opaque_changes
from tests.support.stores import assert_files_of_kept_versions_exist, store_on


def _mount(directory: Path, *options: str) -> bool:
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=256k", *options)), "tmpfs",
                           str(directory)], capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs at tmp_path/disk (skips where this process cannot mount)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or not _mount(disk):
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def _changes(start: int, n: int, size: int):
    return opaque_changes({b"k%06d" % i: os.urandom(size) for i in range(start, start + n)}, max_parallelism=M)


def _fill(disk: Path) -> Path:
    """Writes a file until the disk is full; removing it frees the space."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def _previous_state_is_intact(store, state: dict) -> None:
    """What a fresh process loads: the previous version exactly, and no file left that nothing names
    (but hidden temporaries, which no listing reports)."""
    fresh = store_on(f"file://{store.storage.root.removeprefix('file://')}")
    assert fresh.versions() == [1, 2]
    assert as_dict(fresh.load_checked(2).table) == state
    assert_files_of_kept_versions_exist(fresh)


def test_a_commit_on_a_full_disk_fails_naming_the_file_and_resumes_when_space_returns(small_disk):
    store = store_on(f"file://{small_disk}/store")
    store.commit(1, _changes(0, 20, 64))
    store.commit(2, _changes(20, 20, 64))
    state = as_dict(store.load_checked(2).table)
    filler = _fill(small_disk)

    with pytest.raises(StorageError, match=rf"cannot write {small_disk}/store/\S+: No space left on device"):
        store.commit(3, _changes(40, 400, 512))
    _previous_state_is_intact(store, state)

    filler.unlink()
    changes = _changes(40, 40, 64)
    store.commit(3, changes)
    assert as_dict(store_on(f"file://{small_disk}/store").load_checked(3).table) == {**state, **as_dict(changes)}


def test_a_commit_on_a_read_only_disk_fails_naming_the_file_and_resumes_when_writable(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    if os.geteuid() == 0:
        if not _mount(root):
            pytest.skip("a read-only filesystem needs a mount (root ignores permissions)")
        protect = lambda: subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)   # noqa: E731
        release = lambda: subprocess.run(["mount", "-o", "remount,rw", str(root)], check=True)   # noqa: E731
    else:
        def chmod(mode: int) -> None:
            for directory, _, _ in os.walk(root):
                os.chmod(directory, mode)
        protect, release = (lambda: chmod(0o555)), (lambda: chmod(0o755))
    try:
        store = store_on(f"file://{root}/store")
        store.commit(1, _changes(0, 10, 64))
        store.commit(2, _changes(10, 10, 64))
        state = as_dict(store.load_checked(2).table)
        protect()
        try:
            with pytest.raises(StorageError, match=rf"cannot write {root}/store/\S+: (Read-only file system|"
                                                    rf"Permission denied)"):
                store.commit(3, _changes(20, 10, 64))
            _previous_state_is_intact(store, state)
        finally:
            release()
        changes = _changes(20, 10, 64)
        store.commit(3, changes)
        assert as_dict(store_on(f"file://{root}/store").load_checked(3).table) == {**state, **as_dict(changes)}
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(root)], check=True)
