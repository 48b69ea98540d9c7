package io.sparkstate.shim;

import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/**
 * One version of a partition's state in the JVM: key → value (rows owned by the map), the prefix
 * index when the store scans by prefix, and a running size estimate. A ConcurrentHashMap because
 * Spark removes keys while it iterates (watermark eviction, session merging).
 */
final class StateMap {
  /** Rough per-entry overhead of the map, the two UnsafeRow objects and their arrays. */
  private static final long ENTRY_OVERHEAD = 112;

  final ConcurrentHashMap<UnsafeRow, UnsafeRow> rows;
  private final PrefixIndex prefix;
  private long bytes;
  long version;
  /** Identity of the committed version this map holds (null for version 0): see docs/consistency.md. */
  String commitId;
  /**
   * The map was loaded from opaque (format 1) files: typed deltas cannot build on them, so the next
   * commit ships the whole state once as a typed snapshot.
   */
  boolean opaque;

  /** {@code expectedRows}: how many keys the map will hold (sizes the table once, no rehashing). */
  StateMap(long version, PrefixIndex prefix, long expectedRows) {
    this.version = version;
    this.prefix = prefix;
    this.rows = new ConcurrentHashMap<>((int) Math.max(16, Math.min(expectedRows, 1 << 29)));
  }

  int size() {
    return rows.size();
  }

  long bytes() {
    return bytes;
  }

  UnsafeRow get(UnsafeRow key) {
    return rows.get(key);
  }

  /** Puts rows the map owns (already copied); returns the previous value or null. */
  UnsafeRow put(UnsafeRow key, UnsafeRow value) {
    UnsafeRow old = rows.put(key, value);
    if (old == null) {
      bytes += key.getSizeInBytes() + value.getSizeInBytes() + ENTRY_OVERHEAD;
      if (prefix != null) {
        prefix.add(key);
      }
    } else {
      bytes += value.getSizeInBytes() - old.getSizeInBytes();
    }
    return old;
  }

  /** Removes a key; returns the previous value or null. */
  UnsafeRow remove(UnsafeRow key) {
    UnsafeRow old = rows.remove(key);
    if (old != null) {
      bytes -= key.getSizeInBytes() + old.getSizeInBytes() + ENTRY_OVERHEAD;
      if (prefix != null) {
        prefix.remove(key);
      }
    }
    return old;
  }

  Iterator<UnsafeRowPair> iterator() {
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = rows.entrySet().iterator();
    return new Iterator<UnsafeRowPair>() {
      @Override
      public boolean hasNext() {
        return it.hasNext();
      }

      @Override
      public UnsafeRowPair next() {
        Map.Entry<UnsafeRow, UnsafeRow> e = it.next();
        return new UnsafeRowPair(e.getKey(), e.getValue());
      }
    };
  }

  Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    if (prefix == null) {
      throw new UnsupportedOperationException(
          "spark_state: prefixScan needs a store created with PrefixKeyScanStateEncoderSpec");
    }
    Set<UnsafeRow> keys = prefix.keys(prefixKey);
    Iterator<UnsafeRow> it = keys.iterator();
    return new Iterator<UnsafeRowPair>() {
      private UnsafeRowPair next = advance();

      private UnsafeRowPair advance() {
        while (it.hasNext()) {
          UnsafeRow k = it.next();
          UnsafeRow v = rows.get(k);
          if (v != null) {
            return new UnsafeRowPair(k, v);
          }
        }
        return null;
      }

      @Override
      public boolean hasNext() {
        return next != null;
      }

      @Override
      public UnsafeRowPair next() {
        if (next == null) {
          throw new NoSuchElementException();
        }
        UnsafeRowPair r = next;
        next = advance();
        return r;
      }
    };
  }
}
