package io.sparkstate.shim.engine;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The leading {@code n} columns of a key as their own row: the prefix a session window's store scans by.
 * Generated code, as the codec's KeyHasher hashes: one per thread (a projection is not thread-safe), shared by
 * every store of the key schema, since generating one costs milliseconds and a store is made per load.
 */
final class KeyPrefix {
  /**
   * Shared per leading types: bounded as the codec's schema caches are (a long-lived JVM sees many queries'
   * schemas, which must not pin their generated classes for good): past this many it starts over.
   */
  static final int MAX_SHARED = 256;
  private static final ConcurrentHashMap<List<Object>, KeyPrefix> SHARED = new ConcurrentHashMap<>();

  private final ThreadLocal<UnsafeProjection> projection;

  private KeyPrefix(StructType keySchema, int n) {
    StructField[] fields = keySchema.fields();
    List<Expression> refs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      refs.add(new BoundReference(i, fields[i].dataType(), fields[i].nullable()));
    }
    scala.collection.immutable.Seq<Expression> exprs = CollectionConverters.asScala(refs).toList();
    this.projection = ThreadLocal.withInitial(() -> UnsafeProjection.create(exprs));
  }

  /** The prefix of {@code n} columns of {@code keySchema}'s keys, shared. */
  static KeyPrefix of(StructType keySchema, int n) {
    if (n < 1 || n > keySchema.fields().length) {
      throw new IllegalArgumentException("spark_state: a key prefix of " + n + " columns of " + keySchema.simpleString());
    }
    List<Object> id = new ArrayList<>();
    for (int i = 0; i < n; i++) {   // only what the projection reads: names do not change it
      id.add(keySchema.fields()[i].dataType());
      id.add(keySchema.fields()[i].nullable());
    }
    KeyPrefix shared = SHARED.get(id);
    if (shared != null) {
      return shared;
    }
    if (SHARED.size() >= MAX_SHARED) {
      SHARED.clear();
    }
    return SHARED.computeIfAbsent(id, k -> new KeyPrefix(keySchema, n));
  }

  /**
   * {@code key}'s prefix, in a buffer the calling thread reuses: valid until this thread's next call for any
   * store of the schema; copy it to keep it.
   */
  UnsafeRow prefix(UnsafeRow key) {
    return projection.get().apply(key);
  }
}
