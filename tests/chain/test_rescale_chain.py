"""Metadata-only rescale at the store level, on real files without Spark: every new partition
restores exactly the rows Spark routes to it, for any old and new count (dividing the max
parallelism or not), through several rescales, commits, compaction and retention; retention never
deletes a file another store's manifest names, and does delete it once nothing names it."""

from __future__ import annotations

import shutil
import tempfile
from math import gcd
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.chain import forget_stores, open_store
from spark_state.chain.references import REFS_DIR, Reference, referenced_elsewhere, write_reference
from spark_state.format.manifest import Manifest, ManifestFormat
from spark_state.keygroups import combine_residues, slice_key_groups
from spark_state.lifecycle.rescale import plan_rescale, source_manifest
from spark_state.options import Settings
from spark_state.storage.layout import StoreRef
from tests.support.changes import changes_table

int32 = st.integers(-(2**31), 2**31 - 1)


# ----------------------------------------------------------------- residue math (hypothesis)

@given(st.integers(1, 60), st.integers(0, 59), st.integers(1, 60), st.integers(0, 59), st.lists(int32, max_size=60))
def test_combined_residues_hold_exactly_the_hashes_of_both(n1, r1, n2, r2, hashes):
    r1, r2 = r1 % n1, r2 % n2
    both = combine_residues((n1, r1), (n2, r2))
    for h in hashes + [r1, r2, r1 + n1 * r2]:
        expected = h % n1 == r1 and h % n2 == r2
        got = both is not False and h % both[0] == both[1]
        assert got == expected, (h, (n1, r1), (n2, r2), both)
    if both is not False:
        assert both[0] == n1 * n2 // gcd(n1, n2)
    assert combine_residues(None, (n2, r2)) == (n2, r2) and combine_residues((n1, r1), None) == (n1, r1)


@given(st.integers(1, 400), st.integers(1, 50), st.integers(0, 49), st.lists(int32, max_size=100))
def test_slice_key_groups_are_exactly_the_candidates(m, n, r, hashes):
    r %= n
    kgs, by_hash = slice_key_groups(n, r, m)
    assert by_hash == (m % n != 0)
    for h in hashes:
        if h % n == r:   # a hash of the slice always lies in a candidate key group
            assert h % m in set(kgs.tolist())
        if not by_hash:   # whole key groups: a candidate group holds only hashes of the slice
            assert (h % m in set(kgs.tolist())) == (h % n == r)


# ----------------------------------------------------------------- stores on real files

class Checkpoint:
    """The stores of one operator of one query, as the worker opens them (filesystem storage)."""

    def __init__(self, tmp: Path, m: int, **kw):
        self.tmp, self.m = tmp, m
        self.settings = Settings(max_parallelism=m, snapshot_interval=kw.pop("snapshot_interval", 3),
                                 file_grace_period=kw.pop("file_grace_period", 0), fsync=False, **kw)

    def ref(self, p: int) -> StoreRef:
        state = f"file:{self.tmp}/state"
        return StoreRef(spark_root=state, location=f"{state}/0/{p}", operator=0, partition=p, query_id="q1")

    def store(self, p: int):
        return open_store(self.ref(p), self.settings)

    def rescale(self, old_n: int, new_n: int, version: int) -> None:
        """What lifecycle.rescale writes for the stores: records, then manifests of version + 1."""
        sources = {(0, "default"): {p: source_manifest(self.store(p), version) for p in range(old_n)}}
        plans, references = plan_rescale(sources, old_n, new_n, version + 1, "q1")
        for (holder, referrer), files in sorted(references.items()):
            write_reference(self.store(holder.partition).storage, Reference(referrer, version + 1, tuple(files)))
        for sid, manifest in plans.items():
            self.store(sid.partition).storage.commit_manifest(version + 1, manifest.to_json())


def table(rows: dict[bytes, tuple[int, bytes | None]], m: int) -> pa.Table:
    """Changes of ``rows`` (key -> (hash, value)), for max parallelism ``m``."""
    return changes_table([h for h, _ in rows.values()], list(rows), [v for _, v in rows.values()], max_parallelism=m)


class Model:
    """The whole state as a dict key -> (hash, value), and Spark's routing of it."""

    def __init__(self):
        self.rows: dict[bytes, tuple[int, bytes]] = {}

    def part(self, p: int, n: int) -> dict[bytes, bytes]:
        return {k: v for k, (h, v) in self.rows.items() if h % n == p}

    def commit_all(self, ckpt: Checkpoint, n: int, version: int, changes: dict[bytes, tuple[int, bytes | None]],
                   commit_ids: dict[int, str | None]) -> None:
        for p in range(n):
            mine = {k: hv for k, hv in changes.items() if hv[0] % n == p}
            result = ckpt.store(p).commit(version, table(mine, ckpt.m), base_commit_id=commit_ids.get(p))
            commit_ids[p] = result.commit_id
        for k, (h, v) in changes.items():
            if v is None:
                self.rows.pop(k, None)
            else:
                self.rows[k] = (h, v)


def loaded(ckpt: Checkpoint, p: int, version: int, key_groups=None) -> dict[bytes, bytes]:
    t = ckpt.store(p).load(version, key_groups)
    assert t.column("value").null_count == 0
    keys = t.column("key").to_pylist()
    assert len(keys) == len(set(keys))
    return dict(zip(keys, t.column("value").to_pylist()))


@pytest.fixture
def tmp():
    forget_stores()
    path = Path(tempfile.mkdtemp(prefix="rescale-"))
    yield path
    forget_stores()
    shutil.rmtree(path, ignore_errors=True)


def _changes(data, model: Model, version: int) -> dict[bytes, tuple[int, bytes | None]]:
    new = data.draw(st.dictionaries(st.binary(min_size=1, max_size=4), int32, max_size=25))
    out = {k: (h, b"v%d" % version) for k, h in new.items() if k not in model.rows}
    for k, (h, _) in list(model.rows.items())[:data.draw(st.integers(0, 6))]:
        out[k] = (h, None if data.draw(st.booleans()) else b"u%d" % version)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([4, 12, 16, 60]), st.lists(st.integers(1, 8), min_size=2, max_size=4), st.data())
def test_any_sequence_of_counts_restores_exactly_the_routed_rows(tmp, m, counts, data):
    """Counts up and down, dividing M or not, rescaled again before compaction, commits in between."""
    forget_stores()
    shutil.rmtree(tmp, ignore_errors=True)
    ckpt = Checkpoint(tmp, m, snapshot_interval=100)   # no compaction: slices of slices
    model, ids = Model(), {}
    version = 1
    model.commit_all(ckpt, counts[0], version, _changes(data, model, version), ids)
    for old_n, new_n in zip(counts, counts[1:]):
        if old_n == new_n:
            continue
        ckpt.rescale(old_n, new_n, version)
        version += 1
        ids = {p: ckpt.store(p).load_checked(version).commit_id for p in range(new_n)}
        for p in range(new_n):
            assert loaded(ckpt, p, version) == model.part(p, new_n), (old_n, new_n, p)
            some = [kg for kg in range(0, m, 3)]
            assert loaded(ckpt, p, version, some) == {
                k: v for k, v in model.part(p, new_n).items() if model.rows[k][0] % m in some}
        version += 1
        model.commit_all(ckpt, new_n, version, _changes(data, model, version), ids)
        for p in range(new_n):
            assert loaded(ckpt, p, version) == model.part(p, new_n)


def test_rescaled_manifests_are_format_3_and_plain_ones_stay_format_2(tmp):
    ckpt = Checkpoint(tmp, 16)
    model, ids = Model(), {}
    model.commit_all(ckpt, 2, 1, {b"a": (1, b"1"), b"b": (2, b"2")}, ids)
    plain = Manifest.from_json(ckpt.store(0).storage.read_manifest(1), "m")
    assert plain.format == ManifestFormat.PLAIN == 2 and b"modulus" not in ckpt.store(0).storage.read_manifest(1)
    ckpt.rescale(2, 3, 1)
    sliced = Manifest.from_json(ckpt.store(2).storage.read_manifest(2), "m")
    assert sliced.format == ManifestFormat.SLICED == 3 and all(f.partition in (0, 1) for f in sliced.files)
    assert sliced.query_id == "q1"


def test_retention_keeps_files_other_stores_name_until_none_does(tmp):
    """3 -> 2: partition 0 names files of partitions 1 and 2; retention in every store (grace 0, keep 2)
    runs after every commit; every version any store keeps stays loadable; once the rescaled versions
    age out, the old files and their reference records go."""
    ckpt = Checkpoint(tmp, 12, snapshot_interval=2)
    model, ids = Model(), {}
    rng = np.random.default_rng(7)

    def changes(v):
        return {b"k%d-%d" % (v, i): (int(h), b"v%d" % v) for i, h in enumerate(rng.integers(-2**31, 2**31, 40))}

    for v in (1, 2, 3):
        model.commit_all(ckpt, 3, v, changes(v), ids)
        for p in range(3):
            ckpt.store(p).maintenance(2, v)
    old_files = {p: set(ckpt.store(p).storage.list_files()) for p in range(3)}
    ckpt.rescale(3, 2, 3)
    refs_of_1 = ckpt.store(1).storage.list_files(REFS_DIR)
    assert refs_of_1 and ckpt.store(2).storage.list_files(REFS_DIR)
    ids = {p: ckpt.store(p).load_checked(4).commit_id for p in range(2)}
    # The old partitions' own retention runs while the new partitions still name their files.
    for _ in range(3):
        for p in range(3):
            ckpt.store(p).maintenance(2, 4 if p < 2 else 3)
    for p in range(2):
        assert loaded(ckpt, p, 4) == model.part(p, 2)
    assert old_files[2] <= set(ckpt.store(2).storage.list_files())
    for v in range(5, 10):
        model.commit_all(ckpt, 2, v, changes(v), ids)
        for p in range(2):
            for q in range(2):   # retention of each store, holder and referrer, around every commit
                assert loaded(ckpt, q, v) == model.part(q, 2)
            ckpt.store(p).maintenance(2, v)
        for q in range(3):
            ckpt.store(q).maintenance(2, v if q < 2 else 3)
        for p in range(2):
            for kept in ckpt.store(p).versions():
                loaded(ckpt, p, kept)   # every kept version restores (no file it names is gone)
    # The rescaled version and the old versions are gone, compaction gave partitions 0 and 1 their own
    # snapshots: nothing names partition 1's old files any more, so its retention deleted them and the records.
    assert ckpt.store(0).versions()[0] > 4 and ckpt.store(1).versions()[0] > 4
    assert not ckpt.store(1).storage.list_files(REFS_DIR)
    assert not (old_files[1] & set(ckpt.store(1).storage.list_files()))
    for p in range(2):
        assert loaded(ckpt, p, 9) == model.part(p, 2)


def test_an_unreadable_reference_record_keeps_every_file_while_its_referrer_may_name_them(tmp):
    ckpt = Checkpoint(tmp, 16)
    model, ids = Model(), {}
    model.commit_all(ckpt, 2, 1, {b"a%d" % i: (i * 7919, b"x") for i in range(30)}, ids)
    model.commit_all(ckpt, 2, 2, {b"b%d" % i: (i * 104729, b"y") for i in range(30)}, ids)
    ckpt.rescale(2, 1, 2)
    holder = ckpt.store(1).storage
    [record] = holder.list_files(REFS_DIR)
    holder.write_file(record, b"{torn")   # a rescale that crashed mid-record
    siblings = ckpt.store(1).reader.sibling
    assert referenced_elsewhere(holder, 1, siblings) is None   # partition 0 names files of 1: delete nothing
    for v in (3, 4, 5):
        ckpt.store(1).commit(v, table({}, 16), base_commit_id=ckpt.store(1).load_checked(v - 1).commit_id)
    for _ in range(2):
        ckpt.store(1).maintenance(1, 5)   # compacted at v5, older versions dropped: its older files are orphans of its own
    assert loaded(ckpt, 0, 3) == model.part(0, 1)
    # Judged by its name once readable again; a record of a referrer with no manifest at or above its
    # version yet (a rescale still writing) is live; one whose referrer moved past it is dropped.
    holder.delete_files([record])
    pending = write_reference(holder, Reference(0, 99, ("shared/x",)))
    dead = write_reference(holder, Reference(0, 3, ("shared/y",)))
    ckpt.store(0).commit(4, table({}, 16), base_commit_id=ckpt.store(0).load_checked(3).commit_id)
    ckpt.store(0).maintenance(1, 4)   # compacts the rescaled chain ...
    ckpt.store(0).commit(5, table({}, 16), base_commit_id=ckpt.store(0).load_checked(4).commit_id)
    ckpt.store(0).commit(6, table({}, 16), base_commit_id=ckpt.store(0).load_checked(5).commit_id)
    ckpt.store(0).maintenance(1, 6)   # ... and drops versions 3 and 4, the last that named partition 1
    assert ckpt.store(0).versions() == [5, 6]
    assert referenced_elsewhere(holder, 1, siblings) == {"shared/x"}
    assert holder.list_files(REFS_DIR) == [pending] and dead not in holder.list_files(REFS_DIR)
