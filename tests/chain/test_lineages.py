"""Lineages (Spark's checkpoint format v2): every attempt's commit of a version stays loadable by its commit id,
and a commit builds on the commit Spark names, whichever commit of the base was written last
(docs/consistency.md, rule 7). Real files on a local disk and in memory storage."""

import pytest

from spark_state.errors import ProtocolError, StaleState, VersionNotFound
from spark_state.storage.layout import lineage_name, record_path
from spark_state.storage.memory import MemoryCheckpointStorage, clear_registry
from tests.support.changes import changes, checked_dict
from tests.support.stores import assert_files_of_kept_versions_exist, store_on


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        root = f"file://{tmp_path}/m"
        yield store_on(MemoryCheckpointStorage(root, 64 << 20))
        clear_registry(root)
    else:
        yield store_on(f"file://{tmp_path}/s")


def two_attempts(store):
    """Version 1, then two attempts of version 2 on it: the loser X first, the winner Y written last."""
    one = store.commit(1, changes({b"k1": b"a"}), None, lineage=True)
    x = store.commit(2, changes({b"k2": b"from-x"}), one.commit_id, lineage=True)
    y = store.commit(2, changes({b"k2": b"from-y", b"k3": b"y"}), one.commit_id, lineage=True)
    return one.commit_id, x.commit_id, y.commit_id


def test_each_attempt_of_a_version_loads_by_its_commit_id(store):
    one, x, y = two_attempts(store)
    assert x != y
    assert checked_dict(store.load_checked(2, lineage=x).table) == {b"k1": b"a", b"k2": b"from-x"}
    assert checked_dict(store.load_checked(2, lineage=y).table) == {b"k1": b"a", b"k2": b"from-y", b"k3": b"y"}
    assert store.load_checked(2).commit_id == y, "without an id, the version is its latest commit (format v1)"
    assert store.load_checked(2, x, lineage=x).table is None, "a shim holding that commit loads nothing"
    assert store.load_checked(2, y, lineage=x).commit_id == x


def test_a_commit_builds_on_the_commit_spark_names_not_the_latest(store):
    one, x, y = two_attempts(store)
    # Spark's commit log named X (the attempt whose task succeeded), although Y's manifest landed last (a zombie)
    three = store.commit(3, changes({b"k4": b"d"}), x, lineage=True)
    assert checked_dict(store.load(3)) == {b"k1": b"a", b"k2": b"from-x", b"k4": b"d"}
    assert checked_dict(store.load_checked(3, lineage=three.commit_id).table) == checked_dict(store.load(3))
    # format v1 (no lineage) keeps refusing a base storage no longer holds as the version
    with pytest.raises(StaleState):
        store.commit(3, changes({b"k4": b"d"}), x)


def test_an_unknown_or_malformed_checkpoint_id_is_a_clear_error(store):
    one, x, y = two_attempts(store)
    with pytest.raises(VersionNotFound, match=r"no commit 0123456789abcdef.*commit log"):
        store.load_checked(2, lineage="0123456789abcdef")
    with pytest.raises(VersionNotFound, match="no commit"):
        store.commit(3, changes({b"k4": b"d"}), "0123456789abcdef", lineage=True)
    with pytest.raises(ProtocolError, match="not a commit id"):
        store.load_checked(2, lineage="../../etc")


def test_format_v1_commits_write_no_lineage_manifest(store):
    one = store.commit(1, changes({b"k1": b"a"}), None)
    store.commit(2, changes({b"k2": b"b"}), one.commit_id)
    assert store.storage.list_lineages() == {}


def test_retention_keeps_every_lineage_of_a_kept_version_and_drops_them_with_it(store):
    one, x, y = two_attempts(store)
    assert set(store.storage.list_lineages()) == {(1, one), (2, x), (2, y)}
    store.maintenance(2, version=2)
    assert checked_dict(store.load_checked(2, lineage=x).table) == {b"k1": b"a", b"k2": b"from-x"}
    assert_files_of_kept_versions_exist(store)
    for path in store.reader.read_lineage(2, x).paths:
        assert path in store.storage.list_files(), f"{path} of the losing lineage was deleted while version 2 is kept"
    base = x
    for v in range(3, 6):
        base = store.commit(v, changes({b"k%d" % v: b"v"}), base, lineage=True).commit_id
    store.maintenance(2, version=5)
    assert store.versions() == [4, 5]
    assert {v for v, _ in store.storage.list_lineages()} == {4, 5}
    assert checked_dict(store.load_checked(5, lineage=base).table) == {
        b"k1": b"a", b"k2": b"from-x", b"k3": b"v", b"k4": b"v", b"k5": b"v"}
    assert_files_of_kept_versions_exist(store)


def test_a_lineage_manifest_of_another_commit_is_refused(store, tmp_path):
    one, x, y = two_attempts(store)
    # a lineage file copied by hand under another commit's name
    store.storage.commit_record(2, lineage_name("0123456789abcdef"), store.storage.read_lineage(2, x))
    with pytest.raises(Exception, match="tampered"):
        store.load_checked(2, lineage="0123456789abcdef")
    assert record_path(2, lineage_name(x)) == f"chk-2/_metadata-{x}"
