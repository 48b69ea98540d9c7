package io.sparkstate.shim;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.WeakHashMap;

/**
 * The heap all spark_state stores of this executor may hold, like RocksDB's bounded memory: the option
 * {@code memoryLimit} (the worker parses it and {@code validate} answers it; default a quarter of the
 * heap). A quarter of it is the {@link BlockCache} of row-image blocks; the rest is shared by the
 * stores' in-heap rows (each {@link LayeredMap}'s overlay), and a store whose put takes the total over
 * it spills its overlay to local disk. One per executor JVM.
 */
final class MemoryBudget {
  /** The default limit: a quarter of the heap (Spark leaves its user memory about that share). */
  static final long DEFAULT_LIMIT = Runtime.getRuntime().maxMemory() / 4;
  static final MemoryBudget EXECUTOR = new MemoryBudget(DEFAULT_LIMIT);
  /** The share of the limit the block cache gets. */
  static final int CACHE_SHARE_DIVISOR = 4;

  private final BlockCache cache;
  private volatile long limit;
  /** The maps that count against the budget; weak, so a version nobody closed still goes away. */
  private final Set<LayeredMap> maps = Collections.newSetFromMap(new WeakHashMap<>());

  MemoryBudget(long limit) {
    this.cache = new BlockCache(limit / CACHE_SHARE_DIVISOR);
    this.limit = limit;
  }

  /** Sets the limit (bytes; null: the default). The option set of the store opened last wins. */
  void setLimit(Long bytes) {
    long next = bytes == null || bytes <= 0 ? DEFAULT_LIMIT : bytes;
    if (next != limit) {
      limit = next;
      cache.setCapacity(next / CACHE_SHARE_DIVISOR);
    }
  }

  BlockCache cache() {
    return cache;
  }

  /** What the stores' overlays may hold together. */
  long rowsLimit() {
    return limit - limit / CACHE_SHARE_DIVISOR;
  }

  /** Maps that count against the budget now. */
  synchronized int maps() {
    return maps.size();
  }

  synchronized void register(LayeredMap map) {
    maps.add(map);
  }

  synchronized void unregister(LayeredMap map) {
    maps.remove(map);
  }

  /** Heap the overlays of every open map hold now. */
  long rowsBytes() {
    List<LayeredMap> open;
    synchronized (this) {
      open = new ArrayList<>(maps);
    }
    long total = 0;
    for (LayeredMap m : open) {
      total += m.overlayBytes();
    }
    return total;
  }
}
