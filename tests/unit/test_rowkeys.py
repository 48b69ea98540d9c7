"""Key equality of typed rows (spark_state.chain.rowkeys): equal codes exactly for equal keys, whatever the leaves."""

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from spark_state.chain.rowkeys import key_codes, last_per_key, last_write_mask

INT64 = st.integers(-(2**63), 2**63 - 1)
KEY = pa.struct([("a", pa.int64()), ("b", pa.int32()), ("c", pa.string()), ("d", pa.uint64())])


def _assert_codes_match_equality(rows, type_):
    codes = key_codes(pa.array(rows, type_))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (codes[i] == codes[j]) == (rows[i] == rows[j]), (rows[i], rows[j])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "a": INT64 | st.integers(0, 3),
    "b": st.none() | st.integers(-3, 3),
    "c": st.none() | st.sampled_from(["x", "y", ""]),
    "d": st.integers(0, 2**64 - 1) | st.integers(0, 2),
}), max_size=40))
def test_equal_codes_exactly_for_equal_keys(rows):
    _assert_codes_match_equality(rows, KEY)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(INT64 | st.integers(-2, 2), INT64 | st.integers(-2, 2), INT64 | st.integers(-2, 2)),
                max_size=40))
def test_several_wide_integer_leaves_do_not_overflow_into_collisions(rows):
    type_ = pa.struct([("x", pa.int64()), ("y", pa.int64()), ("z", pa.int64())])
    _assert_codes_match_equality([{"x": x, "y": y, "z": z} for x, y, z in rows], type_)


def test_last_per_key_keeps_the_last_write_of_each_key():
    table = pa.table({"key": pa.array([{"k": 5}, {"k": -1}, {"k": 5}, {"k": 2**62}], pa.struct([("k", pa.int64())])),
                      "v": [1, 2, 3, 4]})
    assert last_per_key(table).column("v").to_pylist() == [2, 3, 4]


def _model_last_writes(keys) -> list[bool]:
    last = {repr(k): i for i, k in enumerate(keys)}
    return [last[repr(k)] == i for i, k in enumerate(keys)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 20) | INT64, max_size=60))
def test_last_write_mask_marks_each_keys_newest_row_dense_or_sparse_codes(ks):
    """Narrow ranges take the direct-addressing path; random 64-bit keys are renumbered first."""
    keys = pa.array([{"k": k} for k in ks], pa.struct([("k", pa.int64())]))
    assert last_write_mask(keys).tolist() == _model_last_writes(ks)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.none() | st.sampled_from(["x", "y", ""]), st.none() | INT64), max_size=40))
def test_last_write_mask_on_chunked_multi_field_keys(rows):
    type_ = pa.struct([("s", pa.string()), ("n", pa.int64())])
    array = pa.array([{"s": s, "n": n} for s, n in rows], type_)
    cut = len(rows) // 2
    chunked = pa.chunked_array([array.slice(0, cut), array.slice(cut)], type_)
    assert last_write_mask(chunked).tolist() == _model_last_writes(rows)
