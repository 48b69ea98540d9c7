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


# ------------------------------------------------------------------ a file written a range at a time

#: A file written a range of rows at a time keeps at most this many values in a column's dictionary: they are
#: collected before its first batch, and a column with more distinct values gains little from one.
MAX_FIXED_VALUES = 1 << 16

Leaf = tuple[str, tuple[int, ...]]   # ("key" or "value", field indices from the struct down to the leaf)


def encodable_leaves(schema: pa.Schema) -> list[Leaf]:
    """The string and binary leaves of a typed table's ``key`` and ``value`` structs (nested ones too)."""
    def walk(t: pa.DataType, path: tuple[int, ...]):
        for i, f in enumerate(t):
            if pa.types.is_struct(f.type):
                yield from walk(f.type, path + (i,))
            elif _encodable(plain_type(f.type)):
                yield path + (i,)
    return [(column, path) for column in ("key", "value") for path in walk(plain_type(schema.field(column).type), ())]


def _leaf(array: pa.Array, path: tuple[int, ...]) -> pa.Array:
    """The leaf's values, null wherever a struct above it is (what such a slot holds is no value of the file)."""
    for i in path:
        array = array.flatten()[i]
    return array


def _with_leaf(array: pa.StructArray, path: tuple[int, ...], leaf: pa.Array) -> pa.StructArray:
    children = [array.field(i) for i in range(array.type.num_fields)]
    i = path[0]
    children[i] = leaf if len(path) == 1 else _with_leaf(children[i], path[1:], leaf)
    return _rebuild(array, children, array.type)


class FixedDictionaries:
    """The dictionaries of a file written a range of rows at a time (compaction: ``datafile.StreamEncoder``).

    Arrow puts a file's dictionaries right after its schema, before the first batch, so they are fixed before
    any row is written: each one holds every value of its column that any input of the merge holds. A sorted
    input contributes the dictionaries of its own head (``take_file``: a column it stores plain, or could not
    say, is not encoded), an input read batch by batch its distinct values (``collect``: a column whose first
    values are mostly distinct, as the whole-table rule samples them, or with more than `max_values` distinct
    values, is not encoded). A dictionary may so hold a value no row has any more (a deleted key's): it only
    costs its bytes. ``fixed`` then says which columns are encoded, and with what."""

    def __init__(self, schema: pa.Schema, max_values: int):
        self.max_values = min(max_values, MAX_FIXED_VALUES)
        self._values: dict[Leaf, list[pa.Array]] = {leaf: [] for leaf in encodable_leaves(schema)}
        self._sampled: set[Leaf] = set()

    def _drop(self, leaf: Leaf) -> None:
        self._values.pop(leaf, None)

    def _add(self, leaf: Leaf, values: pa.Array) -> None:
        held = self._values.get(leaf)
        if held is None:
            return
        held.append(values.drop_null())
        if sum(len(v) for v in held) > self.max_values:
            held[:] = [pc.unique(pa.concat_arrays(held))]
            if len(held[0]) > self.max_values:
                self._drop(leaf)

    def take_file(self, dictionaries: dict[Leaf, pa.Array] | None) -> None:
        """A sorted input's dictionaries (None: it holds no rows, so it constrains nothing)."""
        if dictionaries is None:
            return
        for leaf in list(self._values):
            if leaf in dictionaries:
                self._add(leaf, dictionaries[leaf])
            else:
                self._drop(leaf)

    def collect(self, table: pa.Table) -> None:
        """The distinct values of rows an input holds (plain types, as tables in memory have them)."""
        for leaf in list(self._values):
            column, path = leaf
            values = _leaf(table.column(column).combine_chunks(), path)
            if leaf not in self._sampled and len(values):
                self._sampled.add(leaf)
                if not _few_distinct(values):
                    self._drop(leaf)
                    continue
            self._add(leaf, pc.unique(values))

    def fixed(self) -> dict[Leaf, pa.Array]:
        """Each encoded column's dictionary (its distinct values, in a fixed order)."""
        out = {}
        for leaf, held in self._values.items():
            values = pc.unique(pa.concat_arrays(held)) if held else None
            if values is not None and 0 < len(values) <= self.max_values:
                out[leaf] = values
        return out


def encode_fixed(table: pa.Table, fixed: dict[Leaf, pa.Array]) -> pa.Table:
    """`table` (plain types) with the leaves of `fixed` dictionary-encoded against those dictionaries; a value
    missing from its dictionary is an error (the dictionaries were collected from every input)."""
    for column in ("key", "value"):
        leaves = [(path, d) for (c, path), d in fixed.items() if c == column]
        if not leaves:
            continue
        array = table.column(column).combine_chunks()
        for path, dictionary in leaves:
            leaf = _leaf(array, path)
            codes = pc.index_in(leaf, value_set=dictionary)
            if codes.null_count != leaf.null_count:
                raise ValueError(f"{column} field {path} has a value outside the file's fixed dictionary")
            array = _with_leaf(array, path, pa.DictionaryArray.from_arrays(
                codes.cast(_index_type(len(dictionary))), dictionary))
        field = table.schema.field(column)
        table = table.set_column(table.schema.get_field_index(column),
                                 pa.field(column, array.type, field.nullable, field.metadata), array)
    return table


def leaf_dictionaries(batch: pa.RecordBatch | pa.Table) -> dict[Leaf, pa.Array]:
    """The dictionary of each dictionary leaf of a file's batch (one dictionary per column per file)."""
    out = {}
    for column in ("key", "value"):
        array = batch.column(column)
        if isinstance(array, pa.ChunkedArray):
            array = array.chunk(0)

        def walk(a: pa.Array, path: tuple[int, ...]):
            for i in range(a.type.num_fields):
                child = a.field(i)
                if pa.types.is_struct(child.type):
                    walk(child, path + (i,))
                elif pa.types.is_dictionary(child.type):
                    out[(column, path + (i,))] = child.dictionary
        walk(array, ())
    return out


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
