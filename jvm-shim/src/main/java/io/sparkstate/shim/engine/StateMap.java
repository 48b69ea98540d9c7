package io.sparkstate.shim.engine;

import java.util.Iterator;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/**
 * The rows of one version of a partition's state in this JVM: the one interface Spark's side reads and
 * writes through ({@link Engine} makes them): {@link LayeredMap}, rows in the heap over sorted runs on
 * local disk.
 *
 * <p>{@code put} copies what it keeps: callers pass Spark's rows, whose buffers Spark reuses, and
 * rows a decoder reuses. A write answers what the key was before it, which is all a change log needs
 * (whether to record a delete, whether the batch names a key twice): never the old value, so a write
 * reads no block a filter can rule out.
 *
 * <p>Iterators tolerate puts and removes while they run (Spark removes keys as it iterates: watermark
 * eviction, session merging): each key live at the start and not removed meanwhile is returned exactly
 * once, a value replaced before it is reached is returned new, keys added meanwhile may or may not be.
 */
public interface StateMap {
  /** A write's answer: the key was absent. */
  int ABSENT = 0;
  /** A write's answer: the key was there, last changed before this batch. */
  int HELD = 1;
  /** A write's answer: the key was changed already in this batch (put or removed). */
  int CHANGED = 2;
  /**
   * A put's answer: the key was not changed in this batch; whether it was there before is settled later
   * (the store counts it when its size is asked), so the put read no block.
   */
  int UNCHANGED = 3;

  /** Number of keys. */
  long size();

  /** The number of keys when known without walking the state (a restore that was not told it), else -1. */
  default long knownSize() {
    return size();
  }

  /** Estimated heap bytes the rows take (Spark's memory metric). */
  long bytes();

  /** The key's value, or null. */
  UnsafeRow get(UnsafeRow key);

  /**
   * Whether the key is present (Spark 4.2's {@code keyExists}, deduplication's lookup). A map whose lower levels
   * have key filters answers an absent key from them without reading a block, as {@code get} does.
   */
  default boolean containsKey(UnsafeRow key) {
    return get(key) != null;
  }

  /**
   * The values of {@code keys} (null where absent), in their order (Spark 4.2's {@code multiGet}). Each value is
   * a copy (a lookup's row may share buffers with the next lookup's). This default
   * looks each key up alone; a map may sort the lookups by sort key so that each block is read once.
   */
  default UnsafeRow[] getAll(UnsafeRow[] keys) {
    UnsafeRow[] out = new UnsafeRow[keys.length];
    for (int i = 0; i < keys.length; i++) {
      UnsafeRow v = get(keys[i]);
      out[i] = v == null ? null : v.copy();
    }
    return out;
  }

  /**
   * Sets the key's value (copying both rows); answers {@link #ABSENT}, {@link #HELD}, {@link #CHANGED} or
   * {@link #UNCHANGED}.
   */
  int put(UnsafeRow key, UnsafeRow value);

  /** Removes a key; answers {@link #ABSENT} (nothing removed), {@link #HELD} or {@link #CHANGED}. */
  int remove(UnsafeRow key);

  /** Every row once. */
  Iterator<UnsafeRowPair> iterator();

  /** The rows whose key starts with {@code prefixKey} (stores created with a prefix-scan key encoder). */
  Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey);

  /** What the store holds where, and what it did (metrics). */
  default LocalStats stats() {
    return LocalStats.NONE;
  }

  /** The batch that changed these rows ended (committed, or a new store opened on them). */
  default void endBatch() {
  }

  /** Releases what the rows hold outside the heap (open files); the map is not used again. */
  default void close() {
  }
}
