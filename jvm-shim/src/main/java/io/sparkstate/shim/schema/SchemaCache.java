package io.sparkstate.shim.schema;

import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;

/**
 * What the shim made for a schema (generated code, a codec), kept for the next store of that schema.
 * Bounded: one long-lived JVM (a Connect server, a local session) may see the schemas of many queries,
 * which must not pin their generated classes for good; past {@link #MAX} entries it starts over, as
 * remaking an entry costs milliseconds.
 */
public final class SchemaCache<K, V> {
  public static final int MAX = 256;

  private final ConcurrentHashMap<K, V> map = new ConcurrentHashMap<>();

  public V get(K key) {
    return map.get(key);
  }

  public V computeIfAbsent(K key, Function<? super K, ? extends V> make) {
    V v = map.get(key);
    if (v != null) {
      return v;
    }
    if (map.size() >= MAX) {
      map.clear();
    }
    return map.computeIfAbsent(key, make);
  }
}
