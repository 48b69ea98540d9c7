"""Tables in memory: the shapes rows take between the wire, the chain merge and the file format.

Two row layouts (``spark_state.format.datafile`` says how each is stored):
opaque rows (``CHANGES_SCHEMA``: ``kg``, ``hash`` and Spark's ``UnsafeRow``
bytes) and typed rows (``typed_schema``: ``kg``, ``hash`` and struct ``key``
and ``value`` columns). A null ``value`` is a delete. Tables in memory always
carry ``kg`` first. Past 2 GiB of keys and values a table needs 64-bit
offsets (``widen``/``narrow``, ``widen_typed``/``narrow_typed``); typed
tables of one store may differ in field names and nullability (``align``).
No I/O here.
"""

from __future__ import annotations

import pyarrow as pa

from spark_state.errors import StorageError

CHANGES_SCHEMA = pa.schema([("kg", pa.int32()), ("hash", pa.int32()), ("key", pa.binary()), ("value", pa.binary())])
#: The same rows with 64-bit offsets: what a partition holding more than 2 GiB of keys and values is merged as.
LARGE_SCHEMA = pa.schema([("kg", pa.int32()), ("hash", pa.int32()), ("key", pa.large_binary()),
                          ("value", pa.large_binary())])
#: Above this many key+value bytes a table is handled with 64-bit offsets (binary's limit is 2 GiB).
WIDEN_AT = 1 << 30


def empty_table(like: pa.Schema | pa.Table | None = None) -> pa.Table:
    """No rows, with `like`'s schema (default: the opaque CHANGES_SCHEMA)."""
    if like is None:
        return CHANGES_SCHEMA.empty_table()
    return (like if isinstance(like, pa.Schema) else like.schema).empty_table()


def is_typed(table: pa.Table | pa.Schema) -> bool:
    """Whether rows carry key and value as struct columns (file format 2) rather than row bytes."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    return pa.types.is_struct(schema.field("key").type)


def typed_schema(key: pa.DataType, value: pa.DataType) -> pa.Schema:
    """The in-memory schema of typed rows: kg, hash, key, value (value nullable: null = delete)."""
    return pa.schema([("kg", pa.int32()), ("hash", pa.int32()), pa.field("key", key, nullable=False),
                      ("value", value)])


def conform(table: pa.Table) -> pa.Table:
    """Checks a changes/state table has kg, hash, key, value and casts it to exactly CHANGES_SCHEMA (opaque;
    LARGE_SCHEMA when its key/value already have 64-bit offsets) or, when key and value are structs, to
    int32 kg and hash with the structs as they are (typed)."""
    missing = [f.name for f in CHANGES_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"changes table lacks column(s) {missing}; expected {CHANGES_SCHEMA}")
    table = table.select(CHANGES_SCHEMA.names)
    if is_typed(table):
        if not pa.types.is_struct(table.schema.field("value").type):
            raise ValueError(f"typed changes need struct key and value columns, got {table.schema}")
        target = typed_schema(table.schema.field("key").type, table.schema.field("value").type)
        return table if table.schema == target else table.cast(target)
    target = LARGE_SCHEMA if table.schema.field("key").type == pa.large_binary() else CHANGES_SCHEMA
    if table.schema != target:
        table = table.cast(target)
    return table


def payload_bytes(table: pa.Table) -> int:
    return sum(table.column(name).nbytes for name in ("key", "value"))


def widen(table: pa.Table) -> pa.Table:
    """The table with 64-bit offsets (a cast of the offsets; the bytes are not copied)."""
    return table if table.schema == LARGE_SCHEMA else conform(table).cast(LARGE_SCHEMA)


def narrow(table: pa.Table) -> pa.Table:
    """Back to CHANGES_SCHEMA where the rows fit 32-bit offsets; a table too big for that stays wide."""
    if table.schema == LARGE_SCHEMA and payload_bytes(table) < WIDEN_AT:
        return table.cast(CHANGES_SCHEMA)
    return table


def _wide_type(t: pa.DataType) -> pa.DataType:
    """``t`` with 64-bit offsets for its strings and binaries (inside structs too)."""
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_wide_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_string(t):
        return pa.large_string()
    if pa.types.is_binary(t):
        return pa.large_binary()
    return t


def _retyped_array(array: pa.Array, target: pa.DataType) -> pa.Array:
    if array.type == target:
        return array
    if pa.types.is_struct(target):   # by position: Spark may give two fields one name (sum, sum)
        flat = array.flatten()   # slice-aware (StructArray.field is not)
        children = [_retyped_array(flat[i], target.field(i).type) for i in range(target.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
    if pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type):
        array = pa.concat_arrays([array])   # a slice of a big array: Arrow's cast checks the whole buffer
    return array.cast(target)


def retyped(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Typed rows with `schema`'s offset widths (string vs large_string), struct fields matched by position."""
    columns = [table.column(f.name) for f in schema]
    return pa.Table.from_arrays([c if c.type == f.type else
                                 pa.chunked_array([_retyped_array(x, f.type) for x in c.chunks], f.type)
                                 for c, f in zip(columns, schema)], schema=schema)


def needs_wide(tables: list[pa.Table]) -> bool:
    """Whether concatenating these tables' keys and values could overflow 32-bit offsets."""
    return sum(payload_bytes(t) for t in tables) >= WIDEN_AT


def widen_typed(table: pa.Table) -> pa.Table:
    """Typed rows with 64-bit string/binary offsets (what a partition over 2 GiB is merged as)."""
    return retyped(table, pa.schema([f.with_type(_wide_type(f.type)) for f in table.schema]))


def narrow_typed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Typed rows back to `schema`'s 32-bit offsets, in chunks of ~1 GiB (a chunk must stay under 2 GiB)."""
    if table.schema == schema:
        return table
    per_chunk = max(1, table.num_rows * (1 << 30) // max(1, payload_bytes(table)))
    pieces = [retyped(table.slice(start, per_chunk), schema) for start in range(0, table.num_rows, per_chunk)]
    return pa.concat_tables(pieces) if pieces else retyped(table, schema)


def binary_batches(table: pa.Table, max_rows: int = 65536):
    """Record batches of CHANGES_SCHEMA (what the JVM shim reads), whatever the table's offsets."""
    for batch in table.to_batches(max_chunksize=max_rows):
        yield batch if batch.schema == CHANGES_SCHEMA else batch.cast(CHANGES_SCHEMA)


def align(tables: list[pa.Table]) -> list[pa.Table]:
    """Typed tables of one chain with the newest table's schema: a restarted query may declare the same
    state with other nullability or field names (Spark's schema check allows that), and concatenation
    needs one schema. Struct fields are matched by position, as Spark's rows are."""
    target = tables[-1].schema
    return [t if t.schema == target else cast_positional(t, target) for t in tables]


def _shape(t: pa.DataType) -> pa.DataType:
    """``t`` without its field names and nullability, which do not change Arrow's layout."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f"f{i}", _shape(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_shape(t.key_type), _shape(t.item_type))
    if pa.types.is_large_list(t):
        return pa.large_list(_shape(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_shape(t.value_type), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(_shape(t.value_type))
    return t


def cast_positional(table: pa.Table, target: pa.Schema) -> pa.Table:
    """`table` with `target`'s schema, struct fields matched by position (Spark's rows are positional)."""
    columns = []
    for field in target:
        column = table.column(field.name)
        if column.type != field.type and _shape(column.type) == _shape(field.type):
            # Only names or nullability differ, at any depth: relabel the same buffers. (Arrow's cast matches
            # struct fields by name, also below lists and maps, and would null renamed fields.)
            column = pa.chunked_array([_relabel(chunk, field.type) for chunk in column.chunks], field.type)
        elif pa.types.is_struct(field.type) and column.type != field.type:
            column = pa.chunked_array([_struct_as(chunk, field.type) for chunk in column.chunks], field.type)
        columns.append(column.cast(field.type) if column.type != field.type else column)
    return pa.Table.from_arrays(columns, schema=target)


def _relabel(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array``'s buffers under ``target``'s field names and nullability (same layout, ``_shape``).

    A struct is rebuilt from its relabelled children under its own validity: Arrow's ``view`` refuses a
    child with nulls that ``target`` declares non-nullable, and a delta's deleted rows (a null value struct)
    have such nulls in the value's children even where the query's schema says ``not null``."""
    if pa.types.is_struct(target):
        children = [_relabel(array.field(i), target.field(i).type) for i in range(target.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(target),
                                          mask=array.is_null() if array.null_count else None)
    return array if array.type == target else array.view(target)


def _struct_as(array: pa.StructArray, target: pa.StructType) -> pa.StructArray:
    if array.type.num_fields != target.num_fields:
        raise StorageError(f"state files of one store hold structs with {array.type.num_fields} and "
                           f"{target.num_fields} fields ({array.type} vs {target}); the query's state schema "
                           f"changed in a way Spark does not allow either.")
    children = [array.field(i) for i in range(target.num_fields)]
    children = [c if c.type == target.field(i).type else
                (_struct_as(c, target.field(i).type) if pa.types.is_struct(c.type) else c.cast(target.field(i).type))
                for i, c in enumerate(children)]
    return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
