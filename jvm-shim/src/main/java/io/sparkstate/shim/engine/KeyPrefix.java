package io.sparkstate.shim.engine;

import java.util.List;

import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructType;

import io.sparkstate.shim.schema.LeadingColumns;
import io.sparkstate.shim.schema.SchemaCache;

/**
 * The leading {@code n} columns of a key as their own row: the prefix a session window's store scans by.
 * Generated code, as the codec's KeyHasher hashes: one per thread (a projection is not thread-safe), shared by
 * every store of the key schema, since generating one costs milliseconds and a store is made per load.
 */
final class KeyPrefix {
  /** Shared per leading columns' types (a schema cache: bounded, as a long-lived JVM sees many queries'). */
  private static final SchemaCache<List<Object>, KeyPrefix> SHARED = new SchemaCache<>();

  private final ThreadLocal<UnsafeProjection> projection;

  private KeyPrefix(StructType keySchema, int n) {
    scala.collection.immutable.Seq<Expression> refs = LeadingColumns.refs(keySchema, n);
    this.projection = ThreadLocal.withInitial(() -> UnsafeProjection.create(refs));
  }

  /** The prefix of {@code n} columns of {@code keySchema}'s keys, shared. */
  static KeyPrefix of(StructType keySchema, int n) {
    if (n < 1 || n > keySchema.fields().length) {
      throw new IllegalArgumentException("spark_state: a key prefix of " + n + " columns of " + keySchema.simpleString());
    }
    return SHARED.computeIfAbsent(LeadingColumns.identity(keySchema, n), k -> new KeyPrefix(keySchema, n));
  }

  /**
   * {@code key}'s prefix, in a buffer the calling thread reuses: valid until this thread's next call for any
   * store of the schema; copy it to keep it.
   */
  UnsafeRow prefix(UnsafeRow key) {
    return projection.get().apply(key);
  }
}
