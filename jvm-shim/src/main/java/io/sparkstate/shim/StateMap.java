package io.sparkstate.shim;

import java.util.AbstractMap;
import java.util.AbstractSet;
import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/**
 * One version of a partition's state in the JVM: key → value, and a running size estimate. Rows live in
 * a {@link RowArena} (no objects per row). Stores that scan by prefix (session windows) keep a
 * ConcurrentHashMap of rows the map owns and the prefix index on it (Spark removes keys while it
 * iterates: watermark eviction, session merging).
 */
final class StateMap {
  /** Rough per-entry overhead of the map, the two UnsafeRow objects and their arrays. */
  private static final long ENTRY_OVERHEAD = 112;

  /** Null when the rows are in {@link #arena}. */
  private final ConcurrentHashMap<UnsafeRow, UnsafeRow> rows;
  private final RowArena arena;
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
  StateMap(long version, PrefixIndex prefix, long expectedRows, int keyFields, int valueFields) {
    this.version = version;
    this.prefix = prefix;
    if (prefix == null) {
      this.rows = null;
      this.arena = new RowArena(keyFields, valueFields, expectedRows);
    } else {
      this.rows = new ConcurrentHashMap<>((int) Math.max(16, Math.min(expectedRows, 1 << 29)));
      this.arena = null;
    }
  }

  int size() {
    return arena != null ? arena.size() : rows.size();
  }

  long bytes() {
    return arena != null ? arena.bytes() : bytes;
  }

  /** Whether {@link #put} copies the rows' bytes (the arena), so a caller need not copy them first. */
  boolean copiesRows() {
    return arena != null;
  }

  UnsafeRow get(UnsafeRow key) {
    return arena != null ? arena.get(key) : rows.get(key);
  }

  /**
   * Puts a decoded row whose buffers the decoder reuses: the arena copies the bytes in, the map of
   * owned rows takes copies.
   */
  void load(UnsafeRow key, UnsafeRow value) {
    if (arena != null) {
      arena.put(key, value);
    } else {
      put(key.copy(), value.copy());
    }
  }

  /**
   * Puts rows the caller no longer changes (already copied); returns the previous value or null. The
   * arena copies their bytes; the map of owned rows keeps them.
   */
  UnsafeRow put(UnsafeRow key, UnsafeRow value) {
    if (arena != null) {
      return arena.put(key, value);
    }
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
    if (arena != null) {
      return arena.remove(key);
    }
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
    if (arena != null) {
      return arena.iterator();
    }
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

  /** All rows as a read-only map view (size and entry iteration only), for a commit that ships them whole. */
  Map<UnsafeRow, UnsafeRow> asMap() {
    if (arena == null) {
      return rows;
    }
    return new AbstractMap<UnsafeRow, UnsafeRow>() {
      @Override
      public Set<Map.Entry<UnsafeRow, UnsafeRow>> entrySet() {
        return new AbstractSet<Map.Entry<UnsafeRow, UnsafeRow>>() {
          @Override
          public int size() {
            return arena.size();
          }

          @Override
          public Iterator<Map.Entry<UnsafeRow, UnsafeRow>> iterator() {
            Iterator<UnsafeRowPair> it = arena.iterator();
            return new Iterator<Map.Entry<UnsafeRow, UnsafeRow>>() {
              @Override
              public boolean hasNext() {
                return it.hasNext();
              }

              @Override
              public Map.Entry<UnsafeRow, UnsafeRow> next() {
                UnsafeRowPair p = it.next();
                return new AbstractMap.SimpleImmutableEntry<>(p.key(), p.value());
              }
            };
          }
        };
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
