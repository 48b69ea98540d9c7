package io.sparkstate.shim.engine;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.function.Consumer;

import io.sparkstate.shim.memory.MemoryBudget;
import io.sparkstate.shim.memory.Reservation;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@link StateMap} of stores without prefix scans: a partition's rows in two layers, so state can
 * be larger than the heap and a restore need not decode it.
 * <ul>
 *   <li>the <b>base</b>: a {@link RowImage} on local disk, read a block at a time through the
 *   executor's {@link BlockCache}: the image of the checkpoint's snapshot a restore starts from, or
 *   a spill file this map wrote. It holds a whole state, no tombstones.
 *   <li>the <b>overlay</b>: a {@link RowArena} of the keys whose value differs from the base, and one
 *   of tombstones for keys the base holds that were removed since.
 * </ul>
 * With no base this is the arena alone (the same speed). When the overlays of the executor's maps
 * take more than the {@link MemoryBudget}, the putting map spills: it merges its overlay into its
 * base, in sort order, as a new local image (opened, then unlinked at once, so nothing is left on
 * disk when the store closes or the executor dies), and starts an empty overlay. The image is a cache
 * of state the checkpoint holds: a damaged one fails the task and the store reloads from the
 * checkpoint.
 *
 * <p>Iteration returns each key live at its start and not removed meanwhile exactly once; a value
 * replaced before it is reached is returned new; keys added meanwhile may or may not be (the arena's
 * contract). The overlay is walked first, then the base, skipping keys the overlay holds or deleted:
 * a key that moves into the overlay while an iterator runs is noted by that iterator, which returns
 * it from the overlay when its walk of the base reaches it. Spills wait until no iterator is open.
 * Every method is synchronized, as the arena's.
 */
final class LayeredMap implements StateMap {
  private static final Logger LOG = LoggerFactory.getLogger(LayeredMap.class);
  /** Puts between two looks at the memory budget. */
  private static final int CHECK_EVERY = Math.max(1, Integer.getInteger("spark_state.spillCheckEvery", 1024));
  /**
   * An overlay smaller than this never spills (many small stores would write tiny files), nor one
   * smaller than an eighth of the budget's rows share.
   */
  static final long MIN_SPILL_BYTES = Long.getLong("spark_state.minSpillBytes", 4L << 20);
  private static final UnsafeRow NO_VALUE = emptyRow();

  private final int keyFields;
  private final int valueFields;
  private final KeyOrder hasher;
  private final Engine engine;
  private final Reservation reservation;
  private final Consumer<RowImageException> onDamage;
  private RowArena overlay;
  private RowArena tombstones;
  private RowImage base;
  private long baseRows;
  /** Keys in the map; exact unless {@link #sizeUnknown} (changes loaded blind over a base). */
  private long size;
  private boolean sizeUnknown;
  private boolean closed;
  private int sinceCheck;
  /** The overlay's heap as last measured: what the budget sums without taking this map's lock. */
  private volatile long heldBytes;
  /** The overlay's bytes when a spill last failed (0: it did not): the next try waits for twice as many. */
  private long failedSpillBytes;
  private final List<Scan> scans = new ArrayList<>();
  private long spills;

  /**
   * {@code onDamage}: told of a row image that failed a read (before the exception reaches Spark), so the
   * provider can load rows instead of images from then on.
   */
  public LayeredMap(int keyFields, int valueFields, long expectedRows, KeyOrder hasher, Engine engine,
      Consumer<RowImageException> onDamage) {
    this.onDamage = onDamage;
    this.keyFields = keyFields;
    this.valueFields = valueFields;
    this.hasher = hasher;
    this.engine = engine;
    this.overlay = new RowArena(keyFields, valueFields, expectedRows);
    this.tombstones = new RowArena(keyFields, 0, 16);
    this.reservation = engine.budget().reserve("rows", this);
  }

  /**
   * Makes {@code image} (a whole state of {@code rows} keys, no tombstones) this map's base; call on an
   * empty map, before any change. The map closes it.
   */
  synchronized void setBase(RowImage image, long rows) {
    if (overlay.size() > 0 || tombstones.size() > 0 || base != null) {
      throw new IllegalStateException("spark_state: a base image goes under an empty map");
    }
    base = image;
    baseRows = rows;
    size = rows;
  }

  /**
   * Applies a change loaded from the checkpoint on top of the base (value null: a delete) without
   * looking the key up in the base: a restore's changes cost no block reads. The key count is
   * resolved in one sorted pass over the base when it is first asked ({@link #size}).
   */
  synchronized void loadChange(UnsafeRow key, UnsafeRow value) {
    checkOpen();
    if (value == null) {
      overlay.remove(key);
      if (base != null) {
        tombstones.put(key, NO_VALUE);
      }
    } else {
      tombstones.remove(key);
      overlay.put(key, value);
    }
    sizeUnknown = base != null;
    if (base == null) {
      size = overlay.size();
    }
  }

  /** The exact key count, known from elsewhere (the worker counted the version's keys). */
  synchronized void knowSize(long keys) {
    size = keys;
    sizeUnknown = false;
  }

  @Override
  public synchronized long size() {
    if (sizeUnknown) {
      size = countKeys();
      sizeUnknown = false;
    }
    return size;
  }

  @Override
  public synchronized long bytes() {
    return overlay.bytes() + tombstones.bytes() + (base == null ? 0 : base.heapBytes());
  }

  @Override
  public synchronized long imageRows() {
    return base == null ? 0 : baseRows;
  }

  /** The heap the in-heap layer (overlay and tombstones) takes now. */
  synchronized long overlayBytesNow() {
    return overlay.bytes() + tombstones.bytes();
  }

  /** The overlay's heap as last measured (no lock: the budget reads it from other stores' threads). */
  long overlayBytes() {
    return heldBytes;
  }

  synchronized long spills() {
    return spills;
  }

  @Override
  public synchronized UnsafeRow get(UnsafeRow key) {
    checkOpen();
    UnsafeRow v = overlay.get(key);
    if (v != null || base == null || tombstones.get(key) != null) {
      return v;
    }
    return baseGet(key);
  }

  @Override
  public synchronized UnsafeRow put(UnsafeRow key, UnsafeRow value) {
    checkOpen();
    UnsafeRow old = overlay.put(key, value);
    if (old == null) {
      if (!scans.isEmpty()) {
        UnsafeRow copy = key.copy();
        for (Scan s : scans) {
          s.added.add(copy);
        }
      }
      if (base == null || tombstones.remove(key) != null) {
        size++;
      } else {
        old = baseGet(key);
        if (old == null) {
          size++;
        }
      }
    }
    countChange();
    return old;
  }

  @Override
  public synchronized UnsafeRow remove(UnsafeRow key) {
    checkOpen();
    UnsafeRow old = overlay.remove(key);
    if (old == null && base != null && tombstones.get(key) == null) {
      old = baseGet(key);
    }
    if (old != null) {
      size--;
      if (base != null) {
        tombstones.put(key, NO_VALUE);   // whether or not the base holds the key: a tombstone hides nothing else
      }
      countChange();
    }
    return old;
  }

  @Override
  public synchronized Iterator<UnsafeRowPair> iterator() {
    checkOpen();
    Scan scan = new Scan();
    scans.add(scan);
    return scan;
  }

  @Override
  public Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    throw new UnsupportedOperationException(
        "spark_state: prefixScan needs a store created with PrefixKeyScanStateEncoderSpec");
  }

  /**
   * Forgets iterators a batch left unfinished (Spark need not drain them), so spills may run again, and
   * spills now if the budget is exceeded (a batch of fewer puts than a check interval spills here).
   */
  @Override
  public synchronized void endBatch() {
    scans.clear();
    maybeSpill();
  }

  /**
   * Closes the base image and frees the budget. Any later use fails loudly (never answers "absent" for
   * rows it can no longer read): a store still holding the map fails its task, and the retry reloads.
   */
  @Override
  public synchronized void close() {
    closed = true;
    reservation.close();
    heldBytes = 0;
    closeBase();
  }

  private void checkOpen() {
    if (closed) {
      throw new IllegalStateException("spark_state: this version's rows were dropped (the provider was unloaded "
          + "or reloaded the version); the task must be retried");
    }
  }

  private void countChange() {
    if (++sinceCheck >= CHECK_EVERY) {
      sinceCheck = 0;
      maybeSpill();
    }
  }

  // ------------------------------------------------------------------ spills

  private void maybeSpill() {
    long mine = overlay.bytes() + tombstones.bytes();
    heldBytes = mine;
    reservation.set(mine);
    MemoryBudget budget = engine.budget();
    if (!budget.overLimit()) {
      return;
    }
    engine.cache().trim();
    long floor = Math.max(failedSpillBytes * 2, Math.min(MIN_SPILL_BYTES, budget.limit() / 64));
    if (!scans.isEmpty() || mine < floor || !budget.overLimit()) {
      return;
    }
    try {
      spill();
      failedSpillBytes = 0;
    } catch (IOException | RuntimeException e) {
      failedSpillBytes = mine;
      LOG.warn("spark_state: cannot spill {} bytes of state rows to {} ({}); keeping them on the heap", mine,
          SpillDirectory.get(), e.toString());
    }
  }

  /** Merges the overlay into the base as a new local image; the overlay starts empty. */
  synchronized void spill() throws IOException {
    checkOpen();
    long t0 = System.nanoTime();
    Path file = SpillDirectory.newFile();
    long rows;
    try {
      try (RowImageWriter out = new RowImageWriter(file, RowImageWriter.DEFAULT_BLOCK_BYTES, true)) {
        writeMerged(out);
        rows = out.records();
        out.finish();
      }
      RowImage next = RowImage.open(file, keyFields, valueFields, engine.cache(), true);
      RowImage before = base;
      base = next;
      if (before != null) {
        try {
          before.close();
        } catch (IOException e) {
          LOG.warn("spark_state: cannot close the row image {}: {}", before.path(), e.toString());
        }
      }
    } finally {
      Files.deleteIfExists(file);   // open images read through their descriptor; nothing stays on disk
    }
    baseRows = rows;
    size = rows;
    sizeUnknown = false;
    long freed = overlay.bytes() + tombstones.bytes();
    overlay = new RowArena(keyFields, valueFields, 16);
    tombstones = new RowArena(keyFields, 0, 16);
    heldBytes = overlay.bytes();
    reservation.set(heldBytes);
    spills++;
    LOG.info("spark_state: spilled {} bytes of state rows to local disk ({} rows in the image) in {} ms", freed,
        rows, (System.nanoTime() - t0) / 1_000_000L);
  }

  /** The overlay sorted by sort key, merged with the base's records the overlay does not replace or delete. */
  private void writeMerged(RowImageWriter out) throws IOException {
    int n = (int) overlay.size();
    long[] sortKeys = new long[n];
    int[] slots = new int[n];
    int m = 0;
    for (int i = 0, count = overlay.slotCount(); i < count && m < n; i++) {
      UnsafeRow key = overlay.keyAtSlot(i);
      if (key != null) {
        int h = hasher.hash(key);
        sortKeys[m] = RowImage.sortKey(hasher.keyGroup(h), h);
        slots[m++] = i;
      }
    }
    int[] order = RowImageWriter.sortedPositions(sortKeys);
    RowImage.Cursor below = base == null ? null : base.cursor();
    boolean more = below != null && below.next();
    for (int p : order) {
      long s = sortKeys[p];
      for (; more && below.sortKey() < s; more = below.next()) {
        copyUnlessReplaced(below, out);
      }
      out.add((int) (s >>> 32), (int) s, overlay.keyAtSlot(slots[p]), overlay.valueAtSlot(slots[p]));
    }
    for (; more; more = below.next()) {
      copyUnlessReplaced(below, out);
    }
  }

  private void copyUnlessReplaced(RowImage.Cursor record, RowImageWriter out) throws IOException {
    if (record.deleted()) {
      return;
    }
    UnsafeRow key = record.key();
    if (overlay.get(key) == null && tombstones.get(key) == null) {
      out.add(record.keyGroup(), record.hash(), key, record.value());
    }
  }

  /**
   * The exact key count of the layers as they are: the base's rows, less those a tombstone hides, plus
   * the overlay keys the base does not hold. One walk of the base in sort order against the overlay and
   * tombstone keys sorted the same way: every block is read once, in file order.
   */
  private long countKeys() {
    try {
      return countKeysOnce();
    } catch (RowImageException e) {
      throw damaged(e);
    }
  }

  private long countKeysOnce() {
    int no = (int) overlay.size();
    int nt = (int) tombstones.size();
    long[] sortKeys = new long[no + nt];
    UnsafeRow[] keys = new UnsafeRow[no + nt];
    int m = 0;
    for (RowArena layer : new RowArena[] {overlay, tombstones}) {
      for (int i = 0, count = layer.slotCount(); i < count; i++) {
        UnsafeRow key = layer.keyAtSlot(i);
        if (key != null) {
          int h = hasher.hash(key);
          sortKeys[m] = RowImage.sortKey(hasher.keyGroup(h), h);
          keys[m++] = key;
        }
      }
    }
    long[] exactKeys = java.util.Arrays.copyOf(sortKeys, m);
    int[] order = RowImageWriter.sortedPositions(exactKeys);
    long count = baseRows + no;
    RowImage.Cursor below = base.cursor();
    boolean more = below.next();
    int p = 0;
    while (p < order.length && more) {
      long s = exactKeys[order[p]];
      if (below.sortKey() < s) {
        more = below.next();
        continue;
      }
      if (below.sortKey() > s) {
        p++;
        continue;
      }
      // the base's records of sort key s: each that one of ours names is hidden by a tombstone, or
      // counted twice (overlay and base)
      int q = p;
      while (q < order.length && exactKeys[order[q]] == s) {
        q++;
      }
      for (; more && below.sortKey() == s; more = below.next()) {
        if (below.deleted()) {
          continue;
        }
        UnsafeRow key = below.key();
        for (int r = p; r < q; r++) {
          if (keys[order[r]].equals(key)) {
            count--;
            break;
          }
        }
      }
      p = q;
    }
    return count;
  }

  // ------------------------------------------------------------------ base

  private UnsafeRow baseGet(UnsafeRow key) {
    int h = hasher.hash(key);
    UnsafeRow v;
    try {
      v = base.get(hasher.keyGroup(h), h, key);
    } catch (RowImageException e) {
      throw damaged(e);
    }
    return v == RowImage.DELETED ? null : v;
  }

  /** Tells the owner of a damaged image; returns the exception for the caller to throw. */
  private RowImageException damaged(RowImageException e) {
    onDamage.accept(e);
    return e;
  }

  private void closeBase() {
    if (base != null) {
      try {
        base.close();
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      base = null;
    }
  }

  private static UnsafeRow emptyRow() {
    UnsafeRow row = new UnsafeRow(0);
    row.pointTo(new byte[0], 0);
    return row;
  }

  /** An iterator over both layers (see the class comment). */
  private final class Scan implements Iterator<UnsafeRowPair> {
    /** Keys that entered the overlay after this iterator started. */
    final Set<UnsafeRow> added = new HashSet<>();
    private final Iterator<UnsafeRowPair> upper = overlay.iterator();
    private final RowImage.Cursor lower = base == null ? null : base.cursor();
    private UnsafeRowPair next;
    private boolean done;

    @Override
    public boolean hasNext() {
      if (next == null && !done) {
        synchronized (LayeredMap.this) {
          next = advance();
          if (next == null) {
            done = true;
            scans.remove(this);
          }
        }
      }
      return next != null;
    }

    @Override
    public UnsafeRowPair next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      UnsafeRowPair r = next;
      next = null;
      return r;
    }

    private UnsafeRowPair advance() {
      try {
        return advanceOnce();
      } catch (RowImageException e) {
        throw damaged(e);
      }
    }

    private UnsafeRowPair advanceOnce() {
      while (upper.hasNext()) {
        UnsafeRowPair p = upper.next();
        if (added.isEmpty() || !added.contains(p.key())) {
          return p;
        }
      }
      while (lower != null && lower.next()) {
        if (lower.deleted()) {
          continue;
        }
        UnsafeRow key = lower.key();
        UnsafeRow now = overlay.get(key);
        if (!added.isEmpty() && added.contains(key)) {
          if (now != null) {
            return new UnsafeRowPair(key, now);
          }
        } else if (now == null && tombstones.get(key) == null) {
          return new UnsafeRowPair(key, lower.value());
        }
      }
      return null;
    }
  }
}
