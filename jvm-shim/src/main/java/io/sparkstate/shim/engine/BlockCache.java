package io.sparkstate.shim.engine;

import java.util.concurrent.atomic.AtomicReferenceArray;

import io.sparkstate.shim.memory.MemoryBudget;
import io.sparkstate.shim.memory.Reservation;

/**
 * The decompressed blocks of every open {@link RowImage} of an executor, bounded in bytes (the
 * executor's memory budget sets the bound: a quarter of it, less when what cannot be evicted fills the
 * rest; its blocks are the budget's "cache" reservation). Each image keeps one slot per block pointing at its
 * cached entry, so a hit is an array read and a flag write: no lock, no allocation, no hashing.
 * Eviction is CLOCK (second chance), the usual approximation of LRU with that cheap a hit: the hand
 * walks the ring of cached blocks, clears the flag of a block used since its last visit and evicts
 * the first one that was not.
 *
 * <p>An evicted block's bytes stay valid for whoever holds them: rows handed out point into a
 * byte array the GC keeps alive, never into memory that is reused.
 */
final class BlockCache {
  /** Heap a cached block costs beyond its arrays' contents: the entry and the arrays' headers. */
  static final int ENTRY_OVERHEAD = 80;

  /**
   * One block, decompressed and checked: what its image's slot holds, and a link in the clock ring.
   * {@code restarts} are the offsets of every {@link RowImage#RESTART_INTERVAL}-th record and
   * {@code restartKeys} their sort keys, so a lookup binary-searches a small array, not the block.
   */
  static final class Entry {
    final RowImage image;
    final int block;
    final byte[] bytes;
    final int[] restarts;
    final long[] restartKeys;
    /** Used since the hand last passed it. */
    volatile boolean referenced;
    /** The ring, guarded by the cache. */
    Entry prev;
    Entry next;

    Entry(RowImage image, int block, byte[] bytes, int[] restarts, long[] restartKeys) {
      this.image = image;
      this.block = block;
      this.bytes = bytes;
      this.restarts = restarts;
      this.restartKeys = restartKeys;
    }

    long cost() {
      return bytes.length + 12L * restarts.length + ENTRY_OVERHEAD;
    }
  }

  /** The share of the budget the cache may take at most. */
  static final int BUDGET_SHARE_DIVISOR = 4;
  /** The share it keeps however full the budget is: without a few blocks every lookup reads the disk. */
  static final int MIN_SHARE_DIVISOR = 32;

  private final MemoryBudget budget;
  private final Reservation reservation;
  /** A fixed bound (tests), or -1: a share of the budget. */
  private long fixedCapacity = -1;
  private long used;
  private int blocks;
  private long loads;
  /** The next block the clock looks at (null: nothing cached); new blocks go just behind it. */
  private Entry hand;

  /** A cache bounded by a share of {@code budget}. */
  BlockCache(MemoryBudget budget) {
    this.budget = budget;
    this.reservation = budget.reserve("cache", null);
  }

  /** A cache of a fixed bound (probes and benchmarks), in a budget of its own. */
  BlockCache(long capacityBytes) {
    this(new MemoryBudget(Long.MAX_VALUE / 4));
    setCapacity(capacityBytes);
  }

  /** Sets a fixed bound, evicting down to it now. */
  synchronized void setCapacity(long bytes) {
    if (bytes < 0) {
      throw new IllegalArgumentException("spark_state: a block cache of " + bytes + " bytes");
    }
    fixedCapacity = bytes;
    evictTo(bytes);
  }

  /**
   * The bound now: a fixed one, or a quarter of the budget, less what the budget's other holders take
   * beyond the rest, but never under a thirty-second of it.
   */
  synchronized long capacity() {
    if (fixedCapacity >= 0) {
      return fixedCapacity;
    }
    long limit = budget.limit();
    long others = budget.used() - used;
    long share = Math.min(limit / BUDGET_SHARE_DIVISOR, limit - others);
    return Math.max(limit / MIN_SHARE_DIVISOR, share);
  }

  /** Bytes the cached blocks take (their arrays and entries). */
  synchronized long usedBytes() {
    return used;
  }

  synchronized int blockCount() {
    return blocks;
  }

  /** Blocks lookups read from their files (cache misses) since the cache was created. */
  synchronized long loads() {
    return loads;
  }

  /** The block if cached (marking it used), else null. */
  static Entry lookup(AtomicReferenceArray<Entry> slots, int block) {
    Entry e = slots.get(block);
    if (e != null && !e.referenced) {
      e.referenced = true;
    }
    return e;
  }

  /**
   * Caches a block just read and returns the one to use: that of another thread that cached the same
   * block first, else {@code e} (also when it is larger than the whole cache or its image is closed,
   * and then not cached).
   */
  synchronized Entry insert(Entry e) {
    loads++;
    Entry cached = e.image.slots.get(e.block);
    if (cached != null) {
      return cached;
    }
    long cost = e.cost();
    long capacity = capacity();
    if (cost > capacity || e.image.isClosed()) {
      return e;
    }
    evictTo(capacity - cost);
    if (hand == null) {
      e.prev = e;
      e.next = e;
      hand = e;
    } else {
      e.next = hand;
      e.prev = hand.prev;
      hand.prev.next = e;
      hand.prev = e;
    }
    e.image.slots.set(e.block, e);
    used += cost;
    reservation.add(cost);
    blocks++;
    return e;
  }

  /** Evicts down to the bound as it is now (the budget's other holders grew). */
  synchronized void trim() {
    evictTo(capacity());
  }

  /** Drops every block of an image (it is closing: {@link #insert} caches nothing more of it). */
  synchronized void removeAll(RowImage image) {
    AtomicReferenceArray<Entry> slots = image.slots;
    for (int i = 0; i < slots.length(); i++) {
      Entry e = slots.get(i);
      if (e != null) {
        remove(e);
      }
    }
  }

  private void evictTo(long limit) {
    while (used > limit) {
      Entry e = hand;
      if (e.referenced) {
        e.referenced = false;
        hand = e.next;
      } else {
        remove(e);
      }
    }
  }

  private void remove(Entry e) {
    e.image.slots.compareAndSet(e.block, e, null);
    if (e.next == e) {
      hand = null;
    } else {
      e.prev.next = e.next;
      e.next.prev = e.prev;
      if (hand == e) {
        hand = e.next;
      }
    }
    e.prev = null;
    e.next = null;
    used -= e.cost();
    reservation.add(-e.cost());
    blocks--;
  }
}
