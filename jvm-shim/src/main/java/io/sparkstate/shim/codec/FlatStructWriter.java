package io.sparkstate.shim.codec;

import java.util.List;

import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.DateDayVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.Float4Vector;
import org.apache.arrow.vector.Float8Vector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.SmallIntVector;
import org.apache.arrow.vector.TimeStampVector;
import org.apache.arrow.vector.TinyIntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Writes an {@link UnsafeRow} of a flat schema (fixed-width primitives, string, binary) straight
 * into the Arrow struct vector Spark's {@code ArrowWriter} created for it, making the same vector
 * calls ArrowWriter makes, so the output is the same; it skips ArrowWriter's per-field virtual
 * dispatch and the wrapping row, which were most of a commit's time in the JVM. Other schemas keep
 * ArrowWriter ({@link #supports}).
 */
final class FlatStructWriter {
  private static final int BOOLEAN = 0;
  private static final int BYTE = 1;
  private static final int SHORT = 2;
  private static final int INT = 3;
  private static final int DATE = 4;       // days
  private static final int LONG = 5;
  private static final int TIMESTAMP = 6;  // timestamp and timestamp_ntz (microseconds)
  private static final int FLOAT = 7;
  private static final int DOUBLE = 8;
  private static final int STRING = 9;
  private static final int BINARY = 10;

  private final StructVector struct;
  private final int[] kinds;
  private final FieldVector[] children;

  FlatStructWriter(StructType schema, StructVector struct) {
    this.struct = struct;
    StructField[] fields = schema.fields();
    List<FieldVector> vectors = struct.getChildrenFromFields();
    if (vectors.size() != fields.length) {
      throw new IllegalStateException("spark_state: Arrow struct has " + vectors.size() + " children for "
          + fields.length + " fields of " + schema.simpleString());
    }
    this.kinds = new int[fields.length];
    this.children = vectors.toArray(new FieldVector[0]);
    for (int i = 0; i < fields.length; i++) {
      kinds[i] = kind(fields[i].dataType());
      if (kinds[i] < 0) {
        throw new IllegalArgumentException("spark_state: not a flat type: " + fields[i].dataType());
      }
      checkVector(kinds[i], children[i]);
    }
  }

  /** Whether every field of the schema is a type this writer handles. */
  static boolean supports(StructType schema) {
    for (StructField f : schema.fields()) {
      if (kind(f.dataType()) < 0) {
        return false;
      }
    }
    return true;
  }

  private static int kind(DataType t) {
    if (t instanceof BooleanType) {
      return BOOLEAN;
    } else if (t instanceof ByteType) {
      return BYTE;
    } else if (t instanceof ShortType) {
      return SHORT;
    } else if (t instanceof IntegerType) {
      return INT;
    } else if (t instanceof DateType) {
      return DATE;
    } else if (t instanceof LongType) {
      return LONG;
    } else if (t instanceof TimestampType || t instanceof TimestampNTZType) {
      return TIMESTAMP;
    } else if (t instanceof FloatType) {
      return FLOAT;
    } else if (t instanceof DoubleType) {
      return DOUBLE;
    } else if (t instanceof StringType && ((StringType) t).isUTF8BinaryCollation()) {
      return STRING;
    } else if (t instanceof BinaryType) {
      return BINARY;
    }
    return -1;
  }

  /** The vector ArrowWriter made must be the one this kind writes (a mismatch is a bug, said clearly). */
  private static void checkVector(int kind, FieldVector v) {
    boolean ok;
    switch (kind) {
      case BOOLEAN: ok = v instanceof BitVector; break;
      case BYTE: ok = v instanceof TinyIntVector; break;
      case SHORT: ok = v instanceof SmallIntVector; break;
      case INT: ok = v instanceof IntVector; break;
      case DATE: ok = v instanceof DateDayVector; break;
      case LONG: ok = v instanceof BigIntVector; break;
      case TIMESTAMP: ok = v instanceof TimeStampVector; break;
      case FLOAT: ok = v instanceof Float4Vector; break;
      case DOUBLE: ok = v instanceof Float8Vector; break;
      case STRING: ok = v instanceof VarCharVector; break;
      default: ok = v instanceof VarBinaryVector; break;
    }
    if (!ok) {
      throw new IllegalStateException("spark_state: unexpected Arrow vector " + v.getClass().getSimpleName()
          + " for field " + v.getName());
    }
  }

  /** Writes row {@code i}: the row's fields, or a null struct (all children null) when row is null. */
  void write(int i, UnsafeRow row) {
    if (row == null) {
      for (FieldVector c : children) {
        c.setNull(i);
      }
      struct.setNull(i);
      return;
    }
    for (int f = 0; f < kinds.length; f++) {
      FieldVector c = children[f];
      if (row.isNullAt(f)) {
        c.setNull(i);
        continue;
      }
      switch (kinds[f]) {
        case BOOLEAN: ((BitVector) c).setSafe(i, row.getBoolean(f) ? 1 : 0); break;
        case BYTE: ((TinyIntVector) c).setSafe(i, row.getByte(f)); break;
        case SHORT: ((SmallIntVector) c).setSafe(i, row.getShort(f)); break;
        case INT: ((IntVector) c).setSafe(i, row.getInt(f)); break;
        case DATE: ((DateDayVector) c).setSafe(i, row.getInt(f)); break;
        case LONG: ((BigIntVector) c).setSafe(i, row.getLong(f)); break;
        case TIMESTAMP: ((TimeStampVector) c).setSafe(i, row.getLong(f)); break;
        case FLOAT: ((Float4Vector) c).setSafe(i, row.getFloat(f)); break;
        case DOUBLE: ((Float8Vector) c).setSafe(i, row.getDouble(f)); break;
        case STRING: {
          UTF8String s = row.getUTF8String(f);
          Object base = s.getBaseObject();
          if (base instanceof byte[]) {
            ((VarCharVector) c).setSafe(i, (byte[]) base,
                (int) (s.getBaseOffset() - org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET), s.numBytes());
          } else {
            byte[] b = s.getBytes();
            ((VarCharVector) c).setSafe(i, b, 0, b.length);
          }
          break;
        }
        default: {
          byte[] b = row.getBinary(f);
          ((VarBinaryVector) c).setSafe(i, b, 0, b.length);
          break;
        }
      }
    }
    struct.setIndexDefined(i);
  }
}
