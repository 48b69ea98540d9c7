package io.sparkstate.shim.engine;

import java.util.HashSet;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.StructType;

/**
 * The rows of a store that scans by key prefix (session windows): a ConcurrentHashMap of row copies
 * and a {@link PrefixIndex} on it, so a prefix scan does not visit the whole map. Concurrent because
 * Spark removes keys while it iterates; one writer (the task's store).
 */
final class PrefixScanMap implements StateMap {
  /** Rough per-entry overhead of the map, the two UnsafeRow objects and their arrays. */
  private static final long ENTRY_OVERHEAD = 112;

  private final ConcurrentHashMap<UnsafeRow, UnsafeRow> rows;
  private final PrefixIndex prefix;
  private long bytes;
  /** Keys written in the current batch (the heap holds every row here anyway). */
  private final Set<UnsafeRow> changed = new HashSet<>();

  public PrefixScanMap(StructType keySchema, int numColsPrefixKey, long expectedRows) {
    this.rows = new ConcurrentHashMap<>((int) Math.max(16, Math.min(expectedRows, 1 << 29)));
    this.prefix = new PrefixIndex(keySchema, numColsPrefixKey);
  }

  @Override
  public long size() {
    return rows.size();
  }

  @Override
  public long bytes() {
    return bytes;
  }

  @Override
  public UnsafeRow get(UnsafeRow key) {
    return rows.get(key);
  }

  @Override
  public int put(UnsafeRow key, UnsafeRow value) {
    UnsafeRow k = key.copy();
    UnsafeRow v = value.copy();
    UnsafeRow old = rows.put(k, v);
    if (old == null) {
      bytes += k.getSizeInBytes() + v.getSizeInBytes() + ENTRY_OVERHEAD;
      prefix.add(k);
    } else {
      bytes += v.getSizeInBytes() - old.getSizeInBytes();
    }
    return status(k, old != null);
  }

  @Override
  public int remove(UnsafeRow key) {
    UnsafeRow old = rows.remove(key);
    if (old == null) {
      return ABSENT;
    }
    bytes -= key.getSizeInBytes() + old.getSizeInBytes() + ENTRY_OVERHEAD;
    prefix.remove(key);
    return status(key.copy(), true);
  }

  @Override
  public void endBatch() {
    changed.clear();
  }

  /** What a write answers: whether the key was there, and whether this batch changed it before. */
  private int status(UnsafeRow key, boolean held) {
    if (!changed.add(key)) {
      return CHANGED;
    }
    return held ? HELD : ABSENT;
  }

  @Override
  public Iterator<UnsafeRowPair> iterator() {
    return rows.entrySet().stream().map(e -> new UnsafeRowPair(e.getKey(), e.getValue())).iterator();
  }

  @Override
  public Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    Iterator<UnsafeRow> keys = prefix.keys(prefixKey).iterator();
    return new Iterator<UnsafeRowPair>() {
      private UnsafeRowPair next = advance();

      private UnsafeRowPair advance() {
        while (keys.hasNext()) {
          UnsafeRow k = keys.next();
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
