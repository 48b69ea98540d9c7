"""spark_state.format.unsaferow writes exactly Spark's UnsafeRow bytes: hypothesis rows of random nested
schemas (every supported type, nulls everywhere, garbage under nulls, sliced arrays, NaN payloads, -0.0,
extremes, strings of arbitrary bytes, zero-field structs) go to a real JVM (tests/jvm/UnsafeRowProbe.java,
one JVM for the module), which builds their UnsafeRows with Spark's generated and interpreted
UnsafeProjection; the Python encoder's bytes must equal both, byte for byte, also from the Arrow Spark's
ArrowWriter makes of those rows. A row image's lookups compare key bytes: one differing padding byte
would miss a key."""

from __future__ import annotations

import struct
import subprocess
from decimal import Context, Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from spark_state.format import unsaferow
from tests.support.jvm_probes import ProbeProcess, probe_command

F32_SPECIAL = [0, 0x80000000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFF800001, 0x7F800000,
               0xFF800000, 0x00000001, 0x7F7FFFFF]
F64_SPECIAL = [0, 1 << 63, 0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF7FFFFFFFFFFFF,
               0x7FF0000000000000, 0xFFF0000000000000, 1, 0x7FEFFFFFFFFFFFFF, 0x7FF8000000000123]


def _ints(bits: int):
    lo, hi = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1, 1]))


def _decimals(precision: int, scale: int):
    top = 10 ** precision - 1
    return st.one_of(st.integers(-top, top), st.sampled_from([top, -top, 0, 1, -1])).map(
        lambda u: Decimal(u).scaleb(-scale, Context(prec=60)))


def _strings():
    return st.one_of(st.text(max_size=20).map(lambda s: s.encode()), st.binary(max_size=40))


# name -> (Spark type, Arrow type, strategy of a value, Arrow type the values are built as, then viewed)
LEAVES = {
    "boolean": (T.BooleanType(), pa.bool_(), st.booleans(), None),
    "byte": (T.ByteType(), pa.int8(), _ints(8), None),
    "short": (T.ShortType(), pa.int16(), _ints(16), None),
    "int": (T.IntegerType(), pa.int32(), _ints(32), None),
    "long": (T.LongType(), pa.int64(), _ints(64), None),
    "float": (T.FloatType(), pa.float32(), st.one_of(st.integers(0, 2 ** 32 - 1), st.sampled_from(F32_SPECIAL)),
              pa.uint32()),
    "double": (T.DoubleType(), pa.float64(), st.one_of(st.integers(0, 2 ** 64 - 1), st.sampled_from(F64_SPECIAL)),
               pa.uint64()),
    "date": (T.DateType(), pa.date32(), _ints(32), pa.int32()),
    "timestamp": (T.TimestampType(), pa.timestamp("us", tz="UTC"), _ints(64), pa.int64()),
    "timestamp_tz": (T.TimestampType(), pa.timestamp("us", tz="Asia/Kolkata"), _ints(64), pa.int64()),
    "timestamp_ntz": (T.TimestampNTZType(), pa.timestamp("us"), _ints(64), pa.int64()),
    "daytime": (T.DayTimeIntervalType(), pa.duration("us"), _ints(64), pa.int64()),
    "time": (T.TimeType(6), pa.time64("ns"), st.integers(0, 86_400 * 10 ** 9 - 1), pa.int64()),
    "string": (T.StringType(), pa.string(), _strings(), pa.binary()),
    "binary": (T.BinaryType(), pa.binary(), _strings(), None),
    "decimal_small": (T.DecimalType(18, 4), pa.decimal128(18, 4), _decimals(18, 4), None),
    "decimal_tiny": (T.DecimalType(5, 0), pa.decimal128(5, 0), _decimals(5, 0), None),
    "decimal_big": (T.DecimalType(38, 6), pa.decimal128(38, 6), _decimals(38, 6), None),
    "decimal_mid": (T.DecimalType(20, 2), pa.decimal128(20, 2), _decimals(20, 2), None),
    "null": (T.NullType(), pa.null(), st.none(), None),
}

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6)


def schemas(depth: int = 2):
    """A Spark schema tree: ("leaf", kind, nullable) or ("struct", [(name, node)], nullable)."""
    leaf = st.tuples(st.just("leaf"), st.sampled_from(sorted(LEAVES)), st.booleans())
    if depth == 0:
        return leaf
    return st.one_of(leaf, leaf, leaf, st.tuples(
        st.just("struct"), st.lists(st.tuples(names, schemas(depth - 1)), max_size=5, unique_by=lambda f: f[0]),
        st.booleans()))


def spark_type(node) -> T.DataType:
    if node[0] == "leaf":
        return LEAVES[node[1]][0]
    return T.StructType([T.StructField(name, spark_type(child), nullable(child)) for name, child in node[1]])


def nullable(node) -> bool:
    return node[2] or (node[0] == "leaf" and node[1] == "null")


@st.composite
def arrow_values(draw, node, n: int) -> pa.Array:
    """n values of the node as Arrow; nulls only where nullable, sometimes with data under them."""
    null = draw(st.lists(st.booleans(), min_size=n, max_size=n)) if nullable(node) else [False] * n
    if node[0] == "struct":
        children = [draw(arrow_values(child, n)) for _, child in node[1]]
        t = pa.struct([pa.field(name, c.type, nullable(child)) for (name, child), c in zip(node[1], children)])
        if not children:
            return pa.array([None if x else {} for x in null], t)
        return pa.StructArray.from_arrays(children, fields=list(t), mask=pa.array(null, pa.bool_()))
    _, arrow, strategy, raw = LEAVES[node[1]]
    if node[1] == "null":
        return pa.nulls(n)
    values = draw(st.lists(strategy, min_size=n, max_size=n))
    garbage = draw(st.booleans())   # keep real values under the nulls (Arrow allows any)
    built = pa.array(values if garbage else [None if x else v for v, x in zip(values, null)], raw or arrow)
    if raw is not None:
        built = built.view(arrow)
    if garbage and any(null):
        mask = np.packbits(~np.array(null), bitorder="little")
        built = pa.Array.from_buffers(arrow, n, [pa.py_buffer(mask), *built.buffers()[1:]])
    return built


@st.composite
def cases(draw):
    fields = draw(st.lists(st.tuples(names, schemas()), max_size=6, unique_by=lambda f: f[0]))
    root = ("struct", fields, False)
    n = draw(st.integers(0, 12))
    head = draw(st.integers(0, 2))   # rows cut off the front: the encoder must honour array offsets
    rows = draw(arrow_values(root, n + head))
    return spark_type(root), rows.slice(head)


def read_rows(path) -> list[bytes]:
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">i", data, at)
        out.append(data[at + 4:at + 4 + size])
        at += 4 + size
    return out


def python_rows(array) -> list[bytes]:
    offsets, data = unsaferow.encode(array)
    return [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]


def bits(array: pa.Array) -> pa.Array:
    """Floats as their bit patterns and strings as binaries, so equality is exact (NaN payloads, -0.0)."""
    t = array.type
    if pa.types.is_struct(t) and t.num_fields:
        children = [bits(c) for c in array.flatten()]
        return pa.StructArray.from_arrays(children, names=[f.name for f in t],
                                          mask=array.is_null() if array.null_count else None)
    if pa.types.is_float32(t):
        return array.view(pa.uint32())
    if pa.types.is_float64(t):
        return array.view(pa.uint64())
    if pa.types.is_string(t):
        return array.view(pa.binary())
    return array


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One JVM running tests/jvm/UnsafeRowProbe.java."""
    cmd = probe_command("UnsafeRowProbe.java", "UnsafeRowProbe", tmp_path_factory.mktemp("probe"))
    proc = ProbeProcess(cmd, stderr=subprocess.DEVNULL)

    def spark_rows(schema: T.StructType, rows: pa.Array, out) -> tuple[list[bytes], list[bytes], pa.Array]:
        table = pa.Table.from_arrays([rows], names=["row"])
        with pa.OSFile(str(out / "in.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
        line = proc.answer(f"{schema.json()}\t{out / 'in.arrow'}\t{out}")
        assert line == f"OK {len(rows)}", line
        writer = pa.ipc.open_stream((out / "writer.arrow").read_bytes()).read_all().column("row")
        return read_rows(out / "codegen.bin"), read_rows(out / "interpreted.bin"), writer

    yield spark_rows
    proc.close(timeout=60)


def check_against_spark(probe, out, schema: T.StructType, rows: pa.Array) -> None:
    assert unsaferow.supports(rows.type), unsaferow.supports(rows.type)
    generated, interpreted, writer = probe(schema, rows, out)
    ours = python_rows(rows)
    assert generated == interpreted
    for i, (mine, spark) in enumerate(zip(ours, generated)):
        assert mine == spark, (i, rows[i], mine.hex(" ", 8), spark.hex(" ", 8))
    assert len(ours) == len(generated)
    assert python_rows(writer) == generated, "the Arrow Spark's ArrowWriter makes of the rows encodes differently"
    # and back: the bytes decode to the same values
    offsets = np.cumsum([0] + [len(r) for r in generated])
    decoded = unsaferow.decode(offsets, np.frombuffer(b"".join(generated), np.uint8), rows.type)
    assert bits(decoded).equals(bits(rows)), (decoded, rows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_rows_are_byte_identical_to_spark_unsafe_projection(probe, tmp_path_factory, case):
    schema, rows = case
    check_against_spark(probe, tmp_path_factory.mktemp("case"), schema, rows)


def test_edge_rows_are_byte_identical(probe, tmp_path):
    """The cases a random draw may miss, every run: 70 fields (two null-bitset words), empty and 8-byte
    strings, every decimal size, NaN payloads, nested structs with null children and zero-field ones."""
    kinds = ["long", "string", "boolean", "decimal_big", "float", "null", "binary", "short", "double", "decimal_small"]
    fields = [(f"f{i}", ("leaf", kinds[i % len(kinds)], True)) for i in range(70)]
    nested = ("struct", [("a", ("leaf", "string", True)), ("e", ("struct", [], True)),
                         ("b", ("struct", [("c", ("leaf", "decimal_mid", True))], True))], True)
    schema = T.StructType([T.StructField(name, spark_type(node), True) for name, node in fields]
                          + [T.StructField("n", spark_type(nested), True)])
    n = 6
    cols = []
    for i, (name, node) in enumerate(fields):
        kind = node[1]
        values = {
            "long": [0, -1, 2 ** 63 - 1, -2 ** 63, None, 7],
            "string": [b"", b"12345678", b"123456789", None, b"\xff\xfe", "é".encode()],
            "boolean": [True, False, None, True, False, True],
            "decimal_big": [Decimal(10 ** 32 - 1).scaleb(-6, Context(prec=60)),
                            Decimal(-(10 ** 32 - 1)).scaleb(-6, Context(prec=60)), Decimal(0),
                            None, Decimal(-128).scaleb(-6), Decimal(127).scaleb(-6)],
            "float": [0x7FC00000, 0x7F800001, 0x80000000, None, 0xFFC00001, 1],
            "null": [None] * n,
            "binary": [b"", None, b"\x00" * 8, b"\x00" * 9, b"x" * 100, b"y"],
            "short": [-2 ** 15, 2 ** 15 - 1, 0, None, -1, 1],
            "double": [0x7FF8000000000000, 0x7FF0000000000001, 1 << 63, None, 0xFFF8000000000001, 0],
            "decimal_small": [Decimal(10 ** 18 - 1).scaleb(-4), Decimal(-(10 ** 18 - 1)).scaleb(-4), None,
                              Decimal(0), Decimal(1).scaleb(-4), Decimal(-1).scaleb(-4)],
        }[kind]
        _, arrow, _, raw = LEAVES[kind]
        cols.append(pa.nulls(n) if kind == "null" else pa.array(values, raw or arrow).view(arrow) if raw
                    else pa.array(values, arrow))
    inner = pa.array([{"c": Decimal("1.50")}, {"c": None}, None, {"c": Decimal(-(10 ** 18)).scaleb(-2)},
                      {"c": Decimal(10 ** 18 - 1).scaleb(-2)}, {"c": Decimal("0.01")}],
                     pa.struct([("c", pa.decimal128(20, 2))]))
    empty = pa.array([{}, None, {}, {}, None, {}], pa.struct([]))
    a = pa.array([b"x", None, b"", b"abcdefgh", b"\x80", None], pa.binary()).view(pa.string())
    cols.append(pa.StructArray.from_arrays([a, empty, inner], names=["a", "e", "b"],
                                           mask=pa.array([False, False, False, True, False, False])))
    rows = pa.StructArray.from_arrays(cols, names=[name for name, _ in fields] + ["n"])
    check_against_spark(probe, tmp_path, schema, rows)


def test_zero_field_rows_are_empty(probe, tmp_path):
    """A global aggregation's key has no fields: its UnsafeRow is 0 bytes."""
    rows = pa.array([{}, {}, {}], pa.struct([]))
    check_against_spark(probe, tmp_path, T.StructType([]), rows)
    assert python_rows(rows) == [b"", b"", b""]


# ------------------------------------------------------------------ no JVM

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_decode_reads_back_what_encode_wrote(case):
    _, rows = case
    offsets, data = unsaferow.encode(rows)
    assert np.all(np.diff(offsets) % 8 == 0)
    assert bits(unsaferow.decode(offsets, data, rows.type)).equals(bits(rows))


def test_unsupported_types_say_which_field():
    t = pa.struct([("a", pa.int64()), ("s", pa.struct([("tags", pa.list_(pa.string()))]))])
    support = unsaferow.supports(t)
    assert not support and "s.tags" in support.reason and "list" in support.reason
    for bad in [pa.map_(pa.string(), pa.int32()), pa.uint32(), pa.timestamp("ms"), pa.float16(),
                pa.decimal256(40, 2), pa.month_day_nano_interval(), pa.time64("us"), pa.date64()]:
        assert not unsaferow.supports(pa.struct([("x", bad)])), bad
    assert not unsaferow.supports(pa.int64())
    with pytest.raises(TypeError, match="s.tags"):
        unsaferow.encode(pa.array([], t))


def test_dictionary_strings_encode_as_plain_ones():
    plain = pa.array(["a", "bb", None, "a", "cccccccccc"] * 3)
    wide = pa.array(["a", "bb", None, "a", "cccccccccc"] * 3, pa.large_string())
    rows = [pa.StructArray.from_arrays([c], names=["s"]) for c in (plain, plain.dictionary_encode(), wide)]
    encoded = [python_rows(r) for r in rows]
    assert encoded[0] == encoded[1] == encoded[2]


def test_null_rows_get_no_bytes():
    rows = pa.StructArray.from_arrays([pa.array([1, 2, 3], pa.int64())], names=["x"],
                                      mask=pa.array([False, True, False]))
    offsets, data = unsaferow.encode(rows)
    assert list(np.diff(offsets)) == [16, 0, 16]
    decoded = unsaferow.decode(offsets, data, rows.type, valid=np.array([True, False, True]))
    assert decoded.to_pylist() == [{"x": 1}, None, {"x": 3}]


def test_decimal_outside_its_precision_is_refused():
    arr = pa.Array.from_buffers(pa.decimal128(3, 0), 1, [None, pa.py_buffer(np.array([1000, 0], np.int64))])
    with pytest.raises(ValueError, match="does not fit"):
        unsaferow.encode(pa.StructArray.from_arrays([arr], names=["d"]))
