"""Dictionary-encoded strings in typed state files: smaller files, Spark's plain types everywhere else.

State often repeats a few strings over many rows (a country, a page, a status, a word from a small pool).
Rows are stored in key-group order, i.e. in hash order, so equal strings are rarely neighbours and zstd
keeps most of their bytes; as an Arrow dictionary (each distinct string once, then an int8/16/32 code
per row) such a column is 3-8x smaller (``bench`` rows, 16-letter words from a pool of 1024: 5.1 -> 1.5
bytes per row; ``sessions`` pages and countries: 4.0 and 3.0 -> 0.5).

``encode`` dictionary-encodes a string or binary leaf of the key and value structs (nested structs too)
when its distinct values are at most half its rows (``MAX_DISTINCT_SHARE``) and the file has at least
``MIN_ROWS`` rows (a dictionary message costs a few hundred bytes). It encodes the whole table before
it is cut into record batches, so every batch shares one dictionary and the Arrow IPC stream holds it
once, right after the schema (``spark_state.format.datafile`` relies on that: a key-group subset read decodes
its batches with the stream's head, schema and dictionaries). Deciding costs a sample's distinct count
for columns of unique strings (ids, names), so they pay no full hash pass.

Only files hold dictionaries: ``decode`` turns them back into the plain types Spark's ``ArrowWriter``
produced, which the JVM reads, the chain merge compares and ``read_state`` returns. DuckDB, Polars and
pandas read a file's dictionary columns directly. Files without dictionaries (written before, or whose
strings are mostly distinct) read as before.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: A leaf is dictionary-encoded when distinct values <= this share of its rows.
MAX_DISTINCT_SHARE = 0.5
#: Smaller files keep plain strings: the dictionary message's fixed cost would outweigh the saving.
MIN_ROWS = 128
#: Rows whose distinct count decides, before any full pass, that a column is not worth encoding.
SAMPLE_ROWS = 4096

_ENCODABLE = (pa.types.is_string, pa.types.is_binary, pa.types.is_large_string, pa.types.is_large_binary)


def _encodable(t: pa.DataType) -> bool:
    return any(check(t) for check in _ENCODABLE)


def _index_type(distinct: int) -> pa.DataType:
    return pa.int8() if distinct <= 127 else pa.int16() if distinct <= 32767 else pa.int32()


def _few_distinct(leaf: pa.Array) -> bool:
    """Whether an evenly spread sample of `leaf` repeats enough for the whole column to be worth a look."""
    n = len(leaf)
    if n <= SAMPLE_ROWS:
        return True
    sample = leaf.take(pa.array(np.linspace(0, n - 1, SAMPLE_ROWS).astype(np.int64)))
    return pc.count_distinct(sample, mode="all").as_py() <= SAMPLE_ROWS * MAX_DISTINCT_SHARE


def _encode_leaf(leaf: pa.Array) -> pa.Array:
    if not _few_distinct(leaf):
        return leaf
    encoded = pc.dictionary_encode(leaf)   # nulls stay null (masked), not a dictionary entry
    distinct = len(encoded.dictionary)
    if distinct > len(leaf) * MAX_DISTINCT_SHARE:
        return leaf
    return pa.DictionaryArray.from_arrays(encoded.indices.cast(_index_type(distinct)), encoded.dictionary)


def _rebuild(array: pa.StructArray, children: list[pa.Array], like: pa.StructType) -> pa.StructArray:
    fields = [pa.field(f.name, c.type, f.nullable, f.metadata) for f, c in zip(like, children)]
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _encode_struct(array: pa.StructArray) -> pa.StructArray:
    children = [array.field(i) for i in range(array.type.num_fields)]
    new = [_encode_struct(c) if pa.types.is_struct(c.type) else _encode_leaf(c) if _encodable(c.type) else c
           for c in children]
    if all(a is b for a, b in zip(new, children)):
        return array
    return _rebuild(array, new, array.type)


def encode(table: pa.Table) -> pa.Table:
    """`table` (typed rows, one chunk per column) with its low-cardinality string leaves of ``key`` and
    ``value`` dictionary-encoded; unchanged when none qualifies."""
    if table.num_rows < MIN_ROWS:
        return table
    for name in ("key", "value"):
        column = table.column(name)
        if column.num_chunks != 1:
            raise ValueError("dictionaries.encode needs one chunk per column (combine_chunks first)")
        encoded = _encode_struct(column.chunk(0))
        if encoded is not column.chunk(0):
            field = table.schema.field(name)
            table = table.set_column(table.schema.get_field_index(name),
                                     pa.field(name, encoded.type, field.nullable, field.metadata), encoded)
    return table


# ------------------------------------------------------------------ decoding

def has_dictionaries(t: pa.DataType | pa.Schema) -> bool:
    if isinstance(t, pa.Schema):
        return any(has_dictionaries(f.type) for f in t)
    if pa.types.is_dictionary(t):
        return True
    return pa.types.is_struct(t) and any(has_dictionaries(f.type) for f in t)


def plain_type(t: pa.DataType) -> pa.DataType:
    """`t` with every dictionary replaced by its value type (struct fields matched by position)."""
    if pa.types.is_dictionary(t):
        return t.value_type
    if pa.types.is_struct(t) and has_dictionaries(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in t])
    return t


def _decode_array(array: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(array.type):
        return array.dictionary_decode()
    if pa.types.is_struct(array.type) and has_dictionaries(array.type):
        children = [_decode_array(array.field(i)) for i in range(array.type.num_fields)]
        return _rebuild(array, children, array.type)
    return array


def decode(table: pa.Table) -> pa.Table:
    """`table` with its dictionary columns (at any struct depth) back in their plain types."""
    if not has_dictionaries(table.schema):
        return table
    columns, fields = [], []
    for field, column in zip(table.schema, table.columns):
        if has_dictionaries(field.type):
            target = plain_type(field.type)
            column = pa.chunked_array([_decode_array(chunk) for chunk in column.chunks], target)
            field = field.with_type(target)
        columns.append(column)
        fields.append(field)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))
