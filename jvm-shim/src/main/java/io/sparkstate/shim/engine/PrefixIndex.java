package io.sparkstate.shim.engine;

import java.util.Collections;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructType;

/**
 * Secondary index prefix key → keys of the rows a prefix-scan store ({@code PrefixKeyScanStateEncoderSpec}:
 * session windows) holds in the heap, so a prefix scan does not walk them all (the runs below find a
 * prefix by its hash). Holds its own copies of the keys. Not thread-safe (the store's lock guards it).
 */
final class PrefixIndex {
  /** Shared generated code: a store is made per load, and generating its own cost milliseconds each time. */
  private final KeyPrefix prefixOf;
  /** Heap an entry of the index takes beyond its key's bytes: the set's node, the row object and array. */
  static final long ENTRY_OVERHEAD = 112;

  private final ConcurrentHashMap<UnsafeRow, Set<UnsafeRow>> index = new ConcurrentHashMap<>();
  private long bytes;

  PrefixIndex(StructType keySchema, int numColsPrefixKey) {
    this.prefixOf = KeyPrefix.of(keySchema, numColsPrefixKey);
  }

  /** Adds a key (copied). */
  void add(UnsafeRow key) {
    UnsafeRow prefix = prefixOf.prefix(key);
    Set<UnsafeRow> keys = index.get(prefix);
    if (keys == null) {
      keys = ConcurrentHashMap.newKeySet();
      index.put(prefix.copy(), keys);
      bytes += ENTRY_OVERHEAD + prefix.getSizeInBytes();
    }
    if (keys.add(key.copy())) {
      bytes += ENTRY_OVERHEAD + key.getSizeInBytes();
    }
  }

  void remove(UnsafeRow key) {
    UnsafeRow prefix = prefixOf.prefix(key);
    Set<UnsafeRow> keys = index.get(prefix);
    if (keys != null) {
      if (keys.remove(key)) {
        bytes -= ENTRY_OVERHEAD + key.getSizeInBytes();
      }
      if (keys.isEmpty()) {
        index.remove(prefix, keys);
        bytes -= ENTRY_OVERHEAD + prefix.getSizeInBytes();
      }
    }
  }

  /** Whether {@code key}'s prefix is {@code prefixKey}. */
  boolean hasPrefix(UnsafeRow key, UnsafeRow prefixKey) {
    return prefixOf.prefix(key).equals(prefixKey);
  }

  /** Heap the index takes (about). */
  long bytes() {
    return bytes;
  }

  Set<UnsafeRow> keys(UnsafeRow prefixKey) {
    Set<UnsafeRow> keys = index.get(prefixKey);
    return keys == null ? Collections.emptySet() : keys;
  }

  void clear() {
    index.clear();
    bytes = 0;
  }
}
