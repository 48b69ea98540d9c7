package io.sparkstate.shim.codec;

import java.util.List;

import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Murmur3Hash;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

import io.sparkstate.shim.schema.LeadingColumns;
import io.sparkstate.shim.schema.SchemaCache;

/**
 * A key's hash exactly as Spark's {@code HashPartitioning} computes it for the grouping columns
 * ({@code Murmur3Hash(columns, seed 42)}), and its key group {@code pmod(hash, maxParallelism)}.
 *
 * <p>The hashed columns are the leading {@code numHashFields} columns of the key row: all of them
 * for most operators, the prefix for session windows (partitioned by the keys without the session),
 * all but the trailing {@code index} column for a stream-stream join's keyWithIndexToValue store.
 */
public final class KeyHasher {
  static final int SEED = 42;
  /** The default number of key groups (the worker's option maxParallelism; spark_state/options.py). */
  public static final int DEFAULT_MAX_PARALLELISM = 100_800;
  /** Hashers made for a key schema, shared by the providers of its stores (a map, as providers of many queries may run). */
  private static final SchemaCache<List<Object>, KeyHasher> SHARED = new SchemaCache<>();

  /**
   * The hash as generated code (one projection to an int column): the interpreted expression was a
   * quarter of a commit's time in the JVM. A projection is not thread-safe, so each thread has its own;
   * generating one costs milliseconds, so a thread's serves every store of the schema it hashes for.
   */
  private final ThreadLocal<UnsafeProjection> projection;
  private final int maxParallelism;

  public KeyHasher(StructType keySchema, int numHashFields, int maxParallelism) {
    scala.collection.immutable.Seq<Expression> hash = CollectionConverters.asScala(
        List.<Expression>of(new Murmur3Hash(LeadingColumns.refs(keySchema, numHashFields), SEED))).toSeq();
    this.projection = ThreadLocal.withInitial(() -> UnsafeProjection.create(hash));
    this.maxParallelism = maxParallelism;
  }

  /** The hasher of a store's keys: one per schema, hashed columns and key-group count, shared. */
  public static KeyHasher of(StructType keySchema, int numHashFields, int maxParallelism) {
    List<Object> id = LeadingColumns.identity(keySchema, numHashFields);
    id.add(maxParallelism);
    return SHARED.computeIfAbsent(id, k -> new KeyHasher(keySchema, numHashFields, maxParallelism));
  }

  /**
   * Generates the calling thread's hash code now, not at its first hash. A provider's init calls it: there a
   * cold JVM's code generation (tens of milliseconds) overlaps the worker's start, where the first load would
   * wait for it.
   */
  public void prepare() {
    projection.get();
  }

  /** Number of leading key columns that Spark partitions this store's keys by. */
  public static int hashFieldCount(StructType keySchema, int numColsPrefixKey, String storeName) {
    int n = keySchema.fields().length;
    if (numColsPrefixKey > 0) {
      return numColsPrefixKey;
    }
    if (storeName != null && storeName.endsWith("keyWithIndexToValue") && n > 1) {
      return n - 1;
    }
    return n;
  }

  public int hash(UnsafeRow key) {
    return projection.get().apply(key).getInt(0);
  }

  public int keyGroup(int hash) {
    return pmod(hash, maxParallelism);
  }

  static int pmod(int hash, int m) {
    int r = hash % m;
    return r < 0 ? r + m : r;
  }
}
