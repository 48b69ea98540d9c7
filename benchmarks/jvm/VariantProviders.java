package io.sparkstate.shim;

import io.sparkstate.shim.codec.KeyHasher;
import io.sparkstate.shim.codec.MapChangeLog;
import io.sparkstate.shim.codec.RowFormat;
import io.sparkstate.shim.codec.TypedCodec;
import org.apache.spark.sql.types.StructType;

/**
 * The benchmarks' A/B variants of spark_state's provider (benchmarks/providers.py): each overrides the
 * provider's package-private {@code rowFormat} factory to change one choice the shim makes. Compiled by
 * benchmarks/jvm_bench.py against the shim jar and put beside it on the classpath (same package, same
 * class loader); never part of the jar.
 */
public final class VariantProviders {
  private VariantProviders() {}

  /** File format 1: opaque UnsafeRow bytes whatever the schemas. */
  public static final class OpaqueRows extends SparkStateProvider {
    @Override
    RowFormat rowFormat(StructType keySchema, StructType valueSchema, KeyHasher hasher) {
      return RowFormat.opaque(hasher);
    }
  }

  /** Spark's ArrowWriter for every schema instead of the direct FlatStructWriter. */
  public static final class ArrowWriterOnly extends SparkStateProvider {
    @Override
    RowFormat rowFormat(StructType keySchema, StructType valueSchema, KeyHasher hasher) {
      TypedCodec codec = TypedCodec.arrowWriterOnly(keySchema, valueSchema);
      return codec == null ? super.rowFormat(keySchema, valueSchema, hasher) : RowFormat.typed(codec, hasher);
    }
  }

  /** Typed changes kept as rows and encoded in commit(), instead of encoded at each put and remove. */
  public static final class EncodeAtCommit extends SparkStateProvider {
    @Override
    RowFormat rowFormat(StructType keySchema, StructType valueSchema, KeyHasher hasher) {
      return super.rowFormat(keySchema, valueSchema, hasher).withChangeLogs((format, expected, stream) -> new MapChangeLog(format, expected));
    }
  }
}
