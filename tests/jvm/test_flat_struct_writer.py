"""The shim's direct encoder for flat schemas (jvm-shim FlatStructWriter) produces exactly what Spark's
ArrowWriter produces: random rows of random flat key/value schemas are encoded both ways in a real JVM
(tests/jvm/EncoderProbe.java, one JVM for the module) and the two Arrow streams compared: same schema
(names, nullability, time zone), same values and nulls, and the same bytes."""

from __future__ import annotations

import math
import subprocess

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from tests.support.jvm_probes import ProbeProcess, probe_command

# Spark type, Arrow type of the probe's input, strategy of a value (the raw int for dates and timestamps).
FLAT = {
    "boolean": (T.BooleanType(), pa.bool_(), st.booleans()),
    "byte": (T.ByteType(), pa.int8(), st.integers(-2**7, 2**7 - 1)),
    "short": (T.ShortType(), pa.int16(), st.integers(-2**15, 2**15 - 1)),
    "int": (T.IntegerType(), pa.int32(), st.integers(-2**31, 2**31 - 1)),
    "long": (T.LongType(), pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "float": (T.FloatType(), pa.float32(), st.floats(width=32)),
    "double": (T.DoubleType(), pa.float64(), st.floats()),
    "date": (T.DateType(), pa.date32(), st.integers(-2**31, 2**31 - 1)),
    "timestamp": (T.TimestampType(), pa.timestamp("us", tz="UTC"), st.integers(-2**63, 2**63 - 1)),
    "timestamp_ntz": (T.TimestampNTZType(), pa.timestamp("us"), st.integers(-2**63, 2**63 - 1)),
    "string": (T.StringType(), pa.string(), st.text(max_size=20)),
    "binary": (T.BinaryType(), pa.binary(), st.binary(max_size=20)),
}
# Arrow type of the raw values a date or timestamp array is built from (then viewed as its type).
RAW = {"date": pa.int32(), "timestamp": pa.int64(), "timestamp_ntz": pa.int64()}

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
fields = st.lists(st.tuples(names, st.sampled_from(sorted(FLAT)), st.booleans()), min_size=1, max_size=6,
                  unique_by=lambda f: f[0])


@st.composite
def cases(draw):
    """A key schema, a value schema and rows for them (a null value is a delete)."""
    key, value = draw(fields), draw(fields)
    n = draw(st.integers(0, 30))

    def column(kind, nullable):
        return draw(st.lists(st.none() | FLAT[kind][2] if nullable else FLAT[kind][2], min_size=n, max_size=n))

    key_cols = [column(k, nullable) for _, k, nullable in key]
    value_cols = [column(k, nullable) for _, k, nullable in value]
    deleted = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return key, value, key_cols, value_cols, deleted


def spark_schema(fs) -> T.StructType:
    return T.StructType([T.StructField(name, FLAT[kind][0], nullable) for name, kind, nullable in fs])


def arrow_struct(fs, cols, mask=None) -> pa.StructArray:
    arrays = []
    for (_, kind, _), values in zip(fs, cols):
        if kind in RAW:
            arrays.append(pa.array(values, RAW[kind]).view(FLAT[kind][1]))
        else:
            arrays.append(pa.array(values, FLAT[kind][1]))
    return pa.StructArray.from_arrays(arrays, names=[f[0] for f in fs],
                                      mask=None if mask is None else pa.array(mask, pa.bool_()))


def normalized(v):
    """NaN compares equal to NaN (and -0.0 stays apart from 0.0)."""
    if isinstance(v, float):
        return ("nan",) if math.isnan(v) else (v, math.copysign(1.0, v))
    if isinstance(v, dict):
        return {k: normalized(x) for k, x in v.items()}
    return v


def columns(table: pa.Table) -> dict:
    """Each struct column as its validity and its children's values (dates and timestamps as their raw
    ints: Python's datetime cannot hold every value Spark can), NaN made comparable."""
    out = {}
    for name in table.column_names:
        struct = table.column(name).combine_chunks()
        out[name] = [struct.is_null().to_pylist()]
        for i in range(struct.type.num_fields):
            child = struct.field(i)
            if pa.types.is_temporal(child.type):
                child = child.view(pa.int32() if pa.types.is_date32(child.type) else pa.int64())
            out[name].append([normalized(v) for v in child.to_pylist()])
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One JVM running tests/jvm/EncoderProbe.java against the shim jar built from this tree."""
    cmd = probe_command("EncoderProbe.java", "io.sparkstate.shim.codec.EncoderProbe", tmp_path_factory.mktemp("probe"))
    proc = ProbeProcess(cmd, stderr=subprocess.DEVNULL)
    yield lambda *fields: proc.answer("\t".join(fields))
    proc.close(timeout=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_flat_encoder_writes_what_arrow_writer_writes(probe, tmp_path_factory, case):
    key, value, key_cols, value_cols, deleted = case
    out = tmp_path_factory.mktemp("case")
    n = len(deleted)
    rows = pa.table({"key": arrow_struct(key, key_cols),
                     "value": arrow_struct(value, value_cols, mask=deleted) if n else arrow_struct(value, value_cols)})
    with pa.OSFile(str(out / "in.arrow"), "wb") as f, pa.ipc.new_stream(f, rows.schema) as w:
        w.write_table(rows)
    reply = probe(spark_schema(key).json(), spark_schema(value).json(), str(out / "in.arrow"), str(out))
    assert reply == "OK true", reply

    flat = pa.ipc.open_stream((out / "flat.arrow").read_bytes()).read_all()
    writer = pa.ipc.open_stream((out / "writer.arrow").read_bytes()).read_all()
    assert flat.schema.equals(writer.schema, check_metadata=True), (flat.schema, writer.schema)
    assert flat.num_rows == writer.num_rows == n
    assert columns(flat) == columns(writer)
    # The values are the input's: keys as given, a delete's value null.
    assert columns(flat)["key"] == columns(rows)["key"]
    assert flat.column("value").null_count == sum(deleted)
    assert (out / "flat.arrow").read_bytes() == (out / "writer.arrow").read_bytes()


def test_other_schemas_keep_arrow_writer(probe, tmp_path):
    """A key with a decimal or a nested struct is not flat: the codec keeps ArrowWriter."""
    key = T.StructType([T.StructField("d", T.DecimalType(10, 2), True)])
    value = T.StructType([T.StructField("s", T.StructType([T.StructField("x", T.LongType(), True)]), True)])
    rows = pa.table({"key": pa.StructArray.from_arrays([pa.array([], pa.decimal128(10, 2))], names=["d"]),
                     "value": pa.StructArray.from_arrays(
                         [pa.StructArray.from_arrays([pa.array([], pa.int64())], names=["x"])], names=["s"])})
    with pa.OSFile(str(tmp_path / "in.arrow"), "wb") as f, pa.ipc.new_stream(f, rows.schema) as w:
        w.write_table(rows)
    assert probe(key.json(), value.json(), str(tmp_path / "in.arrow"), str(tmp_path)) == "OK false"
