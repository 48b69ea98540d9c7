"""Key-group math: every hash has exactly one owner, and rescale plans read exactly the right rows."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from spark_state.errors import MaxParallelismChanged
from spark_state.keygroups import (
    as_key_group_array, check_max_parallelism, check_same_max_parallelism, filter_rows, key_group,
    key_groups_of, owned_key_groups, partition_of, partitions_of, read_plan,
)
from spark_state.options import OptionError

int32 = st.integers(-(2**31), 2**31 - 1)


def java_pmod(h: int, n: int) -> int:
    """Spark's pmod with Java's truncating %, written independently of the module under test."""
    r = int(np.fmod(np.int64(h), np.int64(n)))
    return r + n if r < 0 else r


@st.composite
def m_and_divisor(draw):
    """A max parallelism M and a partition count N dividing it."""
    factors = draw(st.lists(st.sampled_from([2, 3, 5, 7]), min_size=0, max_size=5))
    m = int(np.prod(factors)) if factors else 1
    m = m if m <= 2000 else 2000
    divisors = [d for d in range(1, m + 1) if m % d == 0]
    return m, draw(st.sampled_from(divisors))


@settings(deadline=None)
@given(int32, st.integers(1, 5000))
def test_key_group_matches_java_pmod(h, m):
    assert key_group(h, m) == java_pmod(h, m)
    assert int(key_groups_of([h], m)[0]) == java_pmod(h, m)
    assert int(partitions_of(pa.array([h], pa.int32()), m)[0]) == java_pmod(h, m)


@settings(deadline=None, max_examples=50)
@given(int32, m_and_divisor())
def test_every_hash_has_exactly_one_owner(h, mn):
    m, n = mn
    kg = key_group(h, m)
    owners = [p for p in range(n) if kg in owned_key_groups(p, n, m)]
    assert owners == [partition_of(h, n)] == [java_pmod(h, n)]


@settings(deadline=None, max_examples=50)
@given(m_and_divisor())
def test_owned_key_groups_partition_the_key_groups(mn):
    m, n = mn
    all_kgs = np.concatenate([owned_key_groups(p, n, m) for p in range(n)])
    assert sorted(all_kgs.tolist()) == list(range(m))


def _plan_rows(hashes: np.ndarray, m: int, n_old: int, p_new: int, n_new: int) -> np.ndarray:
    """Hashes a new partition obtains by executing its read plan against old partitions' data."""
    kg = np.mod(hashes.astype(np.int64), m)
    old_part = np.mod(hashes.astype(np.int64), n_old)
    plan = read_plan(p_new, n_new, n_old, m)
    got = []
    for src in plan.sources:
        rows = hashes[(old_part == src.partition) & np.isin(kg, src.key_groups)]
        if plan.filter_by_hash:
            table = filter_rows(pa.table({"hash": pa.array(rows, pa.int32())}), p_new, n_new)
            rows = table.column("hash").to_numpy()
        got.append(rows)
    return np.sort(np.concatenate(got)) if got else np.array([], dtype=np.int32)


@settings(max_examples=60, deadline=None)
@given(m_and_divisor(), m_and_divisor(), st.lists(int32, min_size=0, max_size=200), st.data())
def test_rescale_between_divisors_reads_exactly_the_routed_rows(mn, mn2, hashes, data):
    m, n_old = mn
    n_new = data.draw(st.sampled_from([d for d in range(1, m + 1) if m % d == 0]))
    hashes = np.array(hashes, dtype=np.int32)
    for p_new in range(n_new):
        plan = read_plan(p_new, n_new, n_old, m)
        assert not plan.filter_by_hash
        want = np.sort(hashes[np.mod(hashes.astype(np.int64), n_new) == p_new])
        np.testing.assert_array_equal(_plan_rows(hashes, m, n_old, p_new, n_new), want)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(1, 40), st.integers(1, 40), st.lists(int32, min_size=0, max_size=200))
def test_rescale_to_any_count_is_exact_with_the_hash_filter(m, n_old, n_new, hashes):
    hashes = np.array(hashes, dtype=np.int32)
    plan = read_plan(0, n_new, n_old, m)
    assert plan.filter_by_hash == (m % n_new != 0)
    for p_new in range(n_new):
        want = np.sort(hashes[np.mod(hashes.astype(np.int64), n_new) == p_new])
        np.testing.assert_array_equal(_plan_rows(hashes, m, n_old, p_new, n_new), want)


def test_read_plan_reads_only_needed_partitions_and_groups():
    # 4 -> 8 partitions of M=16: new partition 5 needs old partition 1 only, key group 5 and 13.
    plan = read_plan(5, 8, 4, 16)
    assert [s.partition for s in plan.sources] == [1]
    assert plan.sources[0].key_groups.tolist() == [5, 13]
    # 8 -> 4: new partition 1 merges old partitions 1 and 5.
    plan = read_plan(1, 4, 8, 16)
    assert {s.partition: s.key_groups.tolist() for s in plan.sources} == {1: [1, 9], 5: [5, 13]}


def test_validation_errors():
    with pytest.raises(OptionError):
        check_max_parallelism(0)
    with pytest.raises(OptionError):
        check_max_parallelism(2**31)
    with pytest.raises(ValueError, match="do not divide"):
        owned_key_groups(0, 7, 16)
    with pytest.raises(ValueError, match="outside"):
        owned_key_groups(4, 4, 16)
    with pytest.raises(ValueError, match="outside"):
        as_key_group_array([16], 16)
    with pytest.raises(MaxParallelismChanged, match="maxParallelism=128"):
        check_same_max_parallelism(128, 256, "store x")
    check_same_max_parallelism(128, 128, "store x")


def test_key_group_selection_accepts_arrays():
    assert as_key_group_array(pa.array([3, 1, 3], pa.int32()), 8).tolist() == [1, 3]
    assert as_key_group_array(np.array([7, 0]), 8).tolist() == [0, 7]
    assert as_key_group_array(range(2), 8).tolist() == [0, 1]


@given(st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 7), max_size=300))
def test_key_group_order_is_the_stable_argsort(kgs):
    """Rows of one key group keep their order (a delta's rows for one key group stay as the shim sent them)."""
    from spark_state.keygroups import key_group_order

    kg = np.asarray(kgs, dtype=np.int32)
    assert np.array_equal(key_group_order(kg), np.argsort(kg, kind="stable"))


def test_key_group_order_of_negative_values_is_still_argsorts():
    from spark_state.keygroups import key_group_order

    kg = np.asarray([3, -1, 3, 0, -1], dtype=np.int32)
    assert np.array_equal(key_group_order(kg), np.argsort(kg, kind="stable"))
