package io.sparkstate.shim.engine;

import java.util.Iterator;
import java.util.Map;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/**
 * The rows of one version of a partition's state in this JVM: the one interface the stores, the
 * loader and commit use, so another row store can stand behind it. Two today: {@link RowArena} (rows
 * on byte pages, no objects per row) and {@link PrefixScanMap} (stores that scan by key prefix).
 *
 * <p>{@code put} copies what it keeps: callers pass Spark's rows, whose buffers Spark reuses, and
 * rows a decoder reuses. Iterators tolerate puts and removes while they run (Spark removes keys as it
 * iterates: watermark eviction, session merging).
 */
public interface StateMap {
  /** Number of keys. */
  long size();

  /** Estimated heap bytes the rows take (Spark's memory metric). */
  long bytes();

  /** The key's value, or null. */
  UnsafeRow get(UnsafeRow key);

  /** Sets the key's value (copying both rows); returns the previous value or null. */
  UnsafeRow put(UnsafeRow key, UnsafeRow value);

  /** Removes a key; returns the previous value or null. */
  UnsafeRow remove(UnsafeRow key);

  /** Every row once. */
  Iterator<UnsafeRowPair> iterator();

  /** The rows whose key starts with {@code prefixKey} (stores created with a prefix-scan key encoder). */
  Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey);

  /** Keys held in a row image on local disk rather than on the heap (a metric). */
  default long imageRows() {
    return 0;
  }

  /** The batch that changed these rows ended (committed, or a new store opened on them). */
  default void endBatch() {
  }

  /** Releases what the rows hold outside the heap (open files); the map is not used again. */
  default void close() {
  }

  /** The entries of a Java map of rows as pairs, a new pair per row. */
  static Iterator<UnsafeRowPair> pairs(Iterator<Map.Entry<UnsafeRow, UnsafeRow>> entries) {
    return new Iterator<UnsafeRowPair>() {
      @Override
      public boolean hasNext() {
        return entries.hasNext();
      }

      @Override
      public UnsafeRowPair next() {
        Map.Entry<UnsafeRow, UnsafeRow> e = entries.next();
        return new UnsafeRowPair(e.getKey(), e.getValue());
      }
    };
  }
}
