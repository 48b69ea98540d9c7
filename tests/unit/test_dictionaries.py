"""Dictionary-encoded string columns in typed state files (spark_state.format.dictionaries): files hold them,
every reader gets the plain types back, and files written without them still read."""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_state.format import datafile as snapshot, dictionaries
from tests.support.dictionary_rows import M, SCHEMA, fixture_table, make_table, sorted_by_kg
from tests.support.paths import FIXTURES

words = st.sampled_from(["", "a", "DE", "ü/ß", "/product/1042", None])


def _stored_schema(enc: snapshot.EncodedFile) -> pa.Schema:
    return pa.ipc.open_stream(pa.py_buffer(enc.data)).schema


def _dictionary_leaves(t: pa.DataType, prefix: str = "") -> set[str]:
    out = set()
    for f in t:
        if pa.types.is_dictionary(f.type):
            out.add(prefix + f.name)
        elif pa.types.is_struct(f.type):
            out |= _dictionary_leaves(f.type, f"{prefix}{f.name}.")
    return out


def _fetch(data):
    return lambda ranges: [data[a:b] for a, b in ranges]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(0, 600), distinct=st.sampled_from([1, 2, 5, 40, 10_000]), seed=st.integers(0, 2**16),
       null_share=st.sampled_from([0.0, 0.3, 1.0]), deletes=st.booleans(),
       target=st.sampled_from([256, 4096, 1 << 20]), wanted=st.sets(st.integers(0, M - 1)))
def test_round_trip_with_dictionary_columns(rows, distinct, seed, null_share, deletes, target, wanted):
    t = sorted_by_kg(make_table(rows, distinct, seed, null_share=null_share, deletes=deletes))
    enc = snapshot.encode(t, 3, target_batch_bytes=target)
    stored = _dictionary_leaves(_stored_schema(enc))
    if rows >= dictionaries.MIN_ROWS and distinct * 2 <= rows:
        # every repeated leaf is a dictionary; nulls-only leaves have an empty one
        assert {"value.country", "value.blob", "value.inner.page", "value.inner.deep.tag"} <= stored
    if (distinct >= rows and null_share == 0) or rows < dictionaries.MIN_ROWS:
        assert not stored   # (nulls are no dictionary entries: a mostly-null leaf of unique strings qualifies)
    assert "key.user" not in stored and "value.note" not in stored, "unique strings stay plain"
    full = snapshot.decode(enc.data, "f", M)
    assert full.schema == SCHEMA, "readers get the plain types back"
    assert full.equals(t)
    sub = snapshot.read_key_groups(_fetch(enc.data), "f", enc.index_offset, enc.index_length, enc.index_checksum,
                                   np.array(sorted(wanted), dtype=np.int32), file_format=enc.file_format,
                                   max_parallelism=M)
    assert sub.schema == SCHEMA
    assert sub.equals(t.filter(pa.array(np.isin(t.column("kg").to_numpy(), list(wanted)))))


def test_a_file_holds_one_dictionary_per_column_before_its_batches():
    t = sorted_by_kg(make_table(3000, 12, 1))
    enc = snapshot.encode(t, 3, target_batch_bytes=8192)
    src = pa.BufferReader(pa.py_buffer(enc.data[:enc.index_offset]))
    reader = pa.ipc.MessageReader.open_stream(src)
    kinds = []
    while True:
        try:
            kinds.append(reader.read_next_message().type)
        except StopIteration:
            break
    assert kinds[0] == "schema" and kinds.count("dictionary") == 4
    assert set(kinds[1:5]) == {"dictionary"} and set(kinds[5:]) == {"record batch"} and len(kinds) > 6
    # and any Arrow reader sees the dictionary columns directly, with their values
    raw = pa.ipc.open_stream(pa.py_buffer(enc.data)).read_all()
    assert pa.types.is_dictionary(raw.schema.field("value").type.field("country").type)
    assert raw.column("value").combine_chunks().field("country").dictionary_decode().to_pylist() == \
        t.column("value").combine_chunks().field("country").to_pylist()


def test_dictionaries_make_repeated_strings_smaller():
    t = sorted_by_kg(make_table(20_000, 50, 2, null_share=0.0))
    plain = dictionaries.MIN_ROWS
    with_dicts = snapshot.encode(t, 3).size
    try:
        dictionaries.MIN_ROWS = 10**9
        without = snapshot.encode(t, 3).size
    finally:
        dictionaries.MIN_ROWS = plain
    assert with_dicts < 0.8 * without


@pytest.mark.parametrize("rows", [0, 1, 127, 5000])
def test_files_written_without_dictionaries_still_read(monkeypatch, rows):
    """Typed files written before dictionaries (or with only unique strings) hold plain columns."""
    t = sorted_by_kg(make_table(rows, 3, 3))
    monkeypatch.setattr(dictionaries, "encode", lambda table: table)   # the writer before dictionaries
    enc = snapshot.encode(t, 3, target_batch_bytes=4096)
    monkeypatch.undo()
    assert not _dictionary_leaves(_stored_schema(enc))
    assert snapshot.decode(enc.data, "f", M).equals(t)
    wanted = np.arange(0, M, 3, dtype=np.int32)
    sub = snapshot.read_key_groups(_fetch(enc.data), "f", enc.index_offset, enc.index_length, enc.index_checksum,
                                   wanted, file_format=enc.file_format, max_parallelism=M)
    assert sub.equals(t.filter(pa.array(np.isin(t.column("kg").to_numpy(), wanted))))


def test_a_sample_of_unique_strings_skips_the_full_pass(monkeypatch):
    calls = []
    real = dictionaries.pc.dictionary_encode
    monkeypatch.setattr(dictionaries.pc, "dictionary_encode", lambda a: calls.append(len(a)) or real(a))
    unique = pa.array([f"id-{i}" for i in range(50_000)])
    assert dictionaries._encode_leaf(unique) is unique and not calls
    few = pa.array([f"c{i % 7}" for i in range(50_000)])
    assert pa.types.is_dictionary(dictionaries._encode_leaf(few).type) and calls == [50_000]
    assert dictionaries._encode_leaf(few).type.index_type == pa.int8()


def test_decode_keeps_field_names_nullability_and_repeated_names():
    """Spark may give two struct fields one name (sum, sum); decoding goes by position."""
    value = pa.StructArray.from_arrays(
        [pa.array(["x", "y"] * 100), pa.array(["x", None] * 100), pa.array(range(200))],
        fields=[pa.field("sum", pa.string(), False), pa.field("sum", pa.string()), pa.field("n", pa.int64())])
    t = pa.table({"hash": pa.array(range(200), pa.int32()), "key": pa.StructArray.from_arrays(
        [pa.array(range(200))], names=["k"]), "value": value})
    enc = dictionaries.encode(t)
    assert [f.type for f in enc.schema.field("value").type][:2] == [pa.dictionary(pa.int8(), pa.string())] * 2
    back = dictionaries.decode(enc)
    assert back.schema == t.schema and back.equals(t)


def test_a_typed_file_written_before_dictionaries_and_the_batch_index_still_reads():
    """tests/fixtures/format2/v1-plain-index.arrow: plain strings, a row per (key group, batch) in its index."""
    data = (FIXTURES / "format2" / "v1-plain-index.arrow").read_bytes()
    t = fixture_table()
    offset, length = snapshot.read_trailer(data, "v1")
    assert snapshot.decode_index(data[offset:offset + length], "v1", None).schema == snapshot.INDEX_SCHEMA
    assert not _dictionary_leaves(pa.ipc.open_stream(pa.py_buffer(data)).schema)
    assert snapshot.decode(data, "v1", M).equals(t)
    for wanted in ([], [0], [5, 6, 7, 40], list(range(0, M, 2)), list(range(M))):
        sub = snapshot.read_key_groups(_fetch(data), "v1", offset, length, None, np.array(wanted, np.int32),
                                       file_format=snapshot.FileFormat.TYPED, max_parallelism=M)
        assert sub.equals(t.filter(pa.array(np.isin(t.column("kg").to_numpy(), wanted))))


def test_typed_files_index_a_row_per_batch_and_subsets_read_only_their_batches():
    t = fixture_table()
    enc = snapshot.encode(t, 3, target_batch_bytes=4096)
    index = snapshot.decode_index(enc.data[enc.index_offset:enc.index_offset + enc.index_length], "f", None)
    assert index.schema == snapshot.BATCH_INDEX_SCHEMA and index.num_rows > 4
    first, last = index.column("first_kg").to_numpy(), index.column("last_kg").to_numpy()
    assert (first <= last).all() and (last[:-1] <= first[1:]).all()
    assert index.column("rows").to_numpy().sum() == t.num_rows
    ranges = []

    def fetch(rs):
        ranges.extend(rs)
        return [enc.data[a:b] for a, b in rs]

    wanted = np.array([int(first[2])], np.int32)
    sub = snapshot.read_key_groups(fetch, "f", enc.index_offset, enc.index_length, enc.index_checksum, wanted,
                                   file_format=enc.file_format, max_parallelism=M)
    assert sub.equals(t.filter(pa.array(t.column("kg").to_numpy() == wanted[0])))
    batch_bytes = sum(b - a for a, b in ranges[2:])   # after the index and the stream head
    holding = (first <= wanted[0]) & (wanted[0] <= last)
    assert batch_bytes == index.column("length").to_numpy()[holding].sum() < enc.index_offset / 2
