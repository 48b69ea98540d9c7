package io.sparkstate.shim.engine;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Secondary index prefix key → keys for {@code PrefixKeyScanStateEncoderSpec} stores (session
 * windows), so prefixScan does not scan the whole map. Sets are concurrent: callers remove keys
 * while iterating a prefix. Not thread-safe for concurrent writers (one task per store).
 */
final class PrefixIndex {
  private final UnsafeProjection prefixOf;
  private final ConcurrentHashMap<UnsafeRow, Set<UnsafeRow>> index = new ConcurrentHashMap<>();

  PrefixIndex(StructType keySchema, int numColsPrefixKey) {
    StructField[] fields = keySchema.fields();
    List<Expression> refs = new ArrayList<>();
    for (int i = 0; i < numColsPrefixKey; i++) {
      refs.add(new BoundReference(i, fields[i].dataType(), fields[i].nullable()));
    }
    this.prefixOf = UnsafeProjection.create(CollectionConverters.asScala(refs).toList());
  }

  /** Adds a key (already copied, owned by the map). */
  void add(UnsafeRow key) {
    UnsafeRow prefix = prefixOf.apply(key);
    Set<UnsafeRow> keys = index.get(prefix);
    if (keys == null) {
      keys = ConcurrentHashMap.newKeySet();
      index.put(prefix.copy(), keys);
    }
    keys.add(key);
  }

  void remove(UnsafeRow key) {
    UnsafeRow prefix = prefixOf.apply(key);
    Set<UnsafeRow> keys = index.get(prefix);
    if (keys != null) {
      keys.remove(key);
      if (keys.isEmpty()) {
        index.remove(prefix, keys);
      }
    }
  }

  Set<UnsafeRow> keys(UnsafeRow prefixKey) {
    Set<UnsafeRow> keys = index.get(prefixKey);
    return keys == null ? Collections.emptySet() : keys;
  }

  void clear() {
    index.clear();
  }
}
