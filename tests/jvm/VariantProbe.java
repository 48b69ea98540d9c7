package io.sparkstate.shim.codec;

import java.util.List;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.VariantVal;

/**
 * The commit body of a store whose value holds a VariantType (e.g. a stream-stream join's input row with a
 * parse_json column): TypedCodec.forSchemas picks typed rows, then encode must succeed. Prints OK, OPAQUE
 * (the store keeps format 1, which is fine) or FAILED with the error.
 */
public class VariantProbe {
  public static void main(String[] args) throws Exception {
    StructType key = new StructType().add("id", DataTypes.IntegerType);
    StructType value = new StructType().add("v", DataTypes.VariantType).add("n", DataTypes.LongType);
    TypedCodec codec = TypedCodec.forSchemas(key, value);
    if (codec == null) {
      System.out.println("OPAQUE");
      return;
    }
    Class<?> vb = Class.forName("org.apache.spark.types.variant.VariantBuilder");
    Object v = vb.getMethod("parseJson", String.class, boolean.class).invoke(null, "{\"a\":1}", false);
    VariantVal variant = new VariantVal((byte[]) v.getClass().getMethod("getValue").invoke(v),
        (byte[]) v.getClass().getMethod("getMetadata").invoke(v));
    UnsafeRowPair row = new UnsafeRowPair(
        UnsafeProjection.create(key).apply(new GenericInternalRow(new Object[] {1})).copy(),
        UnsafeProjection.create(value).apply(new GenericInternalRow(new Object[] {variant, 1L})).copy());
    try {
      codec.encode(List.of(row).iterator(), 1, new KeyHasher(key, 1, 16));
      System.out.println("OK");
    } catch (Throwable t) {
      System.out.println("FAILED " + t);
    }
  }
}
