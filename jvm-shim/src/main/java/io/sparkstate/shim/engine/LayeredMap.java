package io.sparkstate.shim.engine;

import java.io.IOException;
import java.lang.ref.Cleaner;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.function.Consumer;

import io.sparkstate.shim.memory.MemoryBudget;
import io.sparkstate.shim.memory.Reservation;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.array.ByteArrayMethods;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@link StateMap} of every store, a small log-structured merge tree, so state can be far larger than
 * the heap and a restore need not decode it:
 * <ul>
 *   <li>in the heap, a {@link RowArena} of the keys changed since they were last written to disk, and one
 *   of tombstones for keys removed since (records carry the batch that wrote them);
 *   <li>on local disk, sorted {@link Run}s, newest first, each with a key filter; at the bottom, when the
 *   store was restored from one, the checkpoint's own row image.
 * </ul>
 * A lookup reads the heap, then each run from the newest; a run's filter rules out almost every key it
 * does not hold, so an absent key costs no block read. When the executor's {@link MemoryBudget} is full,
 * the putting store <b>spills</b>: its heap rows, sorted, become a new run (the changes, not the state;
 * the rows a batch changed and older ones go to separate runs, so a key changed twice in a batch is
 * always known). Runs of similar size are <b>merged</b> in the background (each merge at least doubles a
 * run, so a row is rewritten about log2(state / spill) times and a store keeps a few runs); the bottom
 * image is never rewritten, so restores stay lazy. Runs are unlinked once open, so nothing is left on
 * disk when the store closes or the executor dies; they are a cache of state the checkpoint holds: a
 * damaged one fails the task and the store reloads from the checkpoint.
 *
 * <p>The key count is exact without walking the state. A remove of a key the heap does not hold looks it
 * up below; a put takes the answer of a get of the same key just before it (Spark reads a key, then
 * writes it), else asks the filters (enough for a new key) and this batch's runs (a key there was changed
 * twice), and otherwise flags the key as "not known whether it was there" instead of reading a block
 * (the block is rarely still cached): the flagged keys
 * are settled together, in sort order, each block read once, when the count is asked (at commit) or the
 * heap spills. Iteration follows {@link StateMap}'s contract: the
 * heap rows first, then the runs merged, skipping keys the heap holds or deleted; a key that moves into
 * the heap while an iterator runs is noted by that iterator, which returns it from the heap when its walk
 * of the runs reaches it. Spills wait until no iterator is open; merges do not (an iterator holds the
 * runs it walks). Every method is synchronized, as the arena's.
 *
 * <p>A store that scans by key prefix (session windows) hashes keys by their prefix, so all rows of a
 * prefix share a sort key: a prefix scan reads the heap's rows of it (a {@link PrefixIndex}) and that
 * sort key in each run whose filter lets it through.
 */
final class LayeredMap implements StateMap {
  private static final Logger LOG = LoggerFactory.getLogger(LayeredMap.class);
  /** Puts between two looks at the memory budget. */
  private static final int CHECK_EVERY = Math.max(1, Integer.getInteger("spark_state.spillCheckEvery", 1024));
  /** Heap rows smaller than this never spill (many small stores would write tiny files), nor below 1/64 of the budget. */
  static final long MIN_SPILL_BYTES = Long.getLong("spark_state.minSpillBytes", 4L << 20);
  /** Most runs a store keeps (the bottom aside) before it merges its newest two whatever their sizes. */
  static final int MAX_RUNS = 8;
  private static final UnsafeRow NO_VALUE = emptyRow();
  /** Lets go of what a map nobody closed holds (see {@link Remains}). */
  private static final Cleaner CLEANER = Cleaner.create();

  private final int keyFields;
  private final int valueFields;
  private final KeyOrder order;
  private final Engine engine;
  private final Consumer<RowImageException> onDamage;
  /** The heap rows by prefix, for a store that scans by key prefix (else null). */
  private final PrefixIndex prefixes;
  /** The heap rows' share of the budget. */
  private final Reservation heap;
  /**
   * The runs' share (their indexes and filters; each {@link Run} adds its own), released with the map: when it
   * closes, or is collected unclosed (a version nobody closed), as {@link #heap}.
   */
  private final Reservation runCharges;
  /** What {@link #close} lets go of, also when the map is collected unclosed. */
  private final Remains remains;
  private final Cleaner.Cleanable cleanable;
  private RowArena overlay;
  private RowArena tombstones;
  /** Newest first, the bottom last; replaced whole under the lock (a scan or a merge holds its own list). */
  private List<Run> runs = List.of();
  /** The batch now (see {@link #endBatch}); heap records carry its low 8 bits, runs of its rows alone all of it. */
  private long batch;
  /** Keys in the map; exact unless {@link #sizeUnknown} (changes restored blind over an image). */
  private long size;
  private boolean sizeUnknown;
  /** Heap records (rows or tombstones) flagged: whether their key was there before this batch is to settle. */
  private int unsettled;
  private boolean closed;
  private int sinceCheck;
  /** The heap rows' bytes when a spill last failed (0: it did not): the next try waits for twice as many. */
  private long failedSpillBytes;
  private final List<Scan> scans = new ArrayList<>();
  /** A merge of this store is queued or running (one at a time). */
  private boolean merging;
  /** The run the last {@link #below} found its answer in, or null. */
  private Run found;
  /** What the last get learnt below the heap, for a put of the same key (see {@link LastGet}). */
  private final LastGet lastGet = new LastGet();
  private long spills;
  private long spilledBytes;
  private long merges;
  private long mergedBytes;

  /**
   * {@code onDamage}: told of a local file that failed a read (before the exception reaches Spark), so the
   * provider can load rows instead of images from then on.
   */
  LayeredMap(int keyFields, int valueFields, long expectedRows, KeyOrder order, Engine engine,
      Consumer<RowImageException> onDamage) {
    this(keyFields, valueFields, expectedRows, order, engine, onDamage, null);
  }

  /** {@code prefixes}: the index of a store that scans by key prefix, or null. */
  LayeredMap(int keyFields, int valueFields, long expectedRows, KeyOrder order, Engine engine,
      Consumer<RowImageException> onDamage, PrefixIndex prefixes) {
    this.prefixes = prefixes;
    this.onDamage = onDamage;
    this.keyFields = keyFields;
    this.valueFields = valueFields;
    this.order = order;
    this.engine = engine;
    this.overlay = new RowArena(keyFields, valueFields, expectedRows);
    this.tombstones = new RowArena(keyFields, 0, 16);
    this.heap = engine.budget().reserve("rows", null);
    this.runCharges = engine.budget().reserve("runs", null);
    this.remains = new Remains(heap, runCharges);
    this.cleanable = CLEANER.register(this, remains);
  }

  /**
   * The runs and reservations of a map, apart from it so that a map collected unclosed (a version Spark
   * dropped) lets go of them too: its runs' files close and their blocks leave the executor's block cache,
   * which would otherwise keep them (each cached block points at its image) until evicted. That includes the
   * runs its unfinished iterators hold ({@link Hold}). Runs go first, so once the reservations read 0 the
   * cache holds none of the map's blocks.
   */
  private static final class Remains implements Runnable {
    private final Reservation heap;
    private final Reservation runCharges;
    /** The map's runs, as {@link #runs}. */
    volatile List<Run> runs = List.of();
    /** The runs of the map's iterators that have not ended (guarded by itself). */
    private final Set<Hold> holds = Collections.newSetFromMap(new IdentityHashMap<>());

    Remains(Reservation heap, Reservation runCharges) {
      this.heap = heap;
      this.runCharges = runCharges;
    }

    /** An iterator's runs, retained until {@link #release} (or the map is collected). */
    Hold hold(List<Run> held) {
      Hold h = new Hold(held);
      synchronized (holds) {
        holds.add(h);
      }
      return h;
    }

    void release(Hold h) {
      synchronized (holds) {
        if (!holds.remove(h)) {
          return;
        }
      }
      releaseAll(h.runs);
    }

    @Override
    public void run() {
      try {
        List<Hold> left;
        synchronized (holds) {
          left = new ArrayList<>(holds);
          holds.clear();
        }
        for (Hold h : left) {
          releaseAll(h.runs);
        }
        releaseAll(runs);
        runs = List.of();
      } finally {
        heap.close();
        runCharges.close();   // runs a merge still reads are not the store's any more
      }
    }

    private static void releaseAll(List<Run> rs) {
      for (Run r : rs) {
        try {
          r.release();
        } catch (RuntimeException e) {   // the others and the reservations are still let go
          LOG.warn("spark_state: cannot let go of the local state file {}: {}", r.image.path(), e.toString());
        }
      }
    }
  }

  /** The runs one iterator walks, each retained once for it. */
  private static final class Hold {
    final List<Run> runs;

    Hold(List<Run> runs) {
      int n = 0;
      try {
        for (Run r : runs) {
          r.retain();
          n++;
        }
      } catch (RuntimeException e) {   // a closed run: the ones retained already are let go
        Remains.releaseAll(runs.subList(0, n));
        throw e;
      }
      this.runs = runs;
    }
  }

  /** Replaces the runs (under the lock). */
  private void setRuns(List<Run> next) {
    runs = next;
    remains.runs = next;
  }

  /**
   * Makes {@code image} (a whole state of {@code rows} keys, no tombstones) this map's bottom; call on an
   * empty map, before any change. The map closes it.
   */
  synchronized void setBase(RowImage image, long rows) {
    if (overlay.size() > 0 || tombstones.size() > 0 || !runs.isEmpty()) {
      throw new IllegalStateException("spark_state: a base image goes under an empty map");
    }
    setRuns(List.of(newRun(image, true, Run.MIXED, image.path())));
    size = rows;
  }

  /**
   * Applies a change restored from the checkpoint on top of the runs (value null: a delete) without
   * looking the key up: a restore's changes cost no block reads. The key count is then unknown until
   * {@link #knowSize} tells it, or {@link #size} walks the layers once.
   */
  synchronized void loadChange(UnsafeRow key, UnsafeRow value) {
    checkOpen();
    if (value == null) {
      if (overlay.remove(key) != null && prefixes != null) {
        prefixes.remove(key);
      }
      if (mayBeBelow(key)) {
        tombstones.put(key, NO_VALUE);
      }
    } else {
      tombstones.remove(key);
      if (overlay.put(key, value) == null && prefixes != null) {
        prefixes.add(key);
      }
    }
    sizeUnknown = !runs.isEmpty();
    if (runs.isEmpty()) {
      size = overlay.size();
    }
    countChange();
  }

  /** The exact key count, known from elsewhere (the worker counted the version's keys). */
  synchronized void knowSize(long keys) {
    size = keys;
    sizeUnknown = false;
  }

  @Override
  public synchronized long knownSize() {
    if (sizeUnknown) {
      return -1;
    }
    settle();
    return size;
  }

  @Override
  public synchronized long size() {
    if (sizeUnknown) {
      size = countKeys();
      sizeUnknown = false;
      settled(false);
    }
    settle();
    return size;
  }

  @Override
  public synchronized long bytes() {
    long n = heapBytes();
    for (Run r : runs) {
      n += r.image.heapBytes();
    }
    return n;
  }

  @Override
  public synchronized LocalStats stats() {
    long disk = 0;
    for (Run r : runs) {
      disk += r.records();
    }
    return new LocalStats(heapBytes(), disk, runs.size(), spills, spilledBytes, merges, mergedBytes);
  }

  /** The heap the in-heap rows (and tombstones, and the prefix index) take now. */
  synchronized long overlayBytesNow() {
    return heapBytes();
  }

  private long heapBytes() {
    return overlay.bytes() + tombstones.bytes() + (prefixes == null ? 0 : prefixes.bytes());
  }

  synchronized long spills() {
    return spills;
  }

  /** Waits until no merge of this store is queued or running (tests, benchmarks); false on timeout. */
  synchronized boolean awaitMerges(long timeoutMs) throws InterruptedException {
    long end = System.currentTimeMillis() + timeoutMs;
    while (merging) {
      long left = end - System.currentTimeMillis();
      if (left <= 0) {
        return false;
      }
      wait(Math.min(left, 50));
    }
    return true;
  }

  /** Runs on local disk now, the bottom included (tests). */
  synchronized int runCount() {
    return runs.size();
  }

  @Override
  public synchronized UnsafeRow get(UnsafeRow key) {
    checkOpen();
    UnsafeRow v = overlay.get(key);
    if (v != null || runs.isEmpty() || (tombstones.size() > 0 && tombstones.get(key) != null)) {
      return v;
    }
    v = below(key, order.hash(key));
    if (v != null && found.batch == batch) {   // a run of this batch's own rows: changed twice
      lastGet.remember(key, runs, batch, CHANGED, v == RowImage.DELETED);
    } else {
      lastGet.remember(key, runs, batch, v == null || v == RowImage.DELETED ? ABSENT : HELD, false);
    }
    return v == RowImage.DELETED ? null : v;
  }

  @Override
  public synchronized int put(UnsafeRow key, UnsafeRow value) {
    checkOpen();
    int status;
    if (overlay.put(key, value) != null) {
      status = overlay.previousEpoch() == epoch() ? CHANGED : HELD;
    } else {
      noteAdded(key);
      if (prefixes != null) {
        prefixes.add(key);
      }
      if (tombstones.size() > 0 && tombstones.remove(key) != null) {
        size++;
        status = tombstones.previousEpoch() == epoch() ? CHANGED : ABSENT;
        if (tombstones.previousFlag()) {
          overlay.flag(key);   // still to settle: the flag moves with the key
        }
      } else if (runs.isEmpty()) {
        size++;
        status = ABSENT;
      } else if (lastGet.answers(key, runs, batch)) {   // Spark's get of this key just read its block
        status = lastGet.status;
        size += status == ABSENT || lastGet.deletedThisBatch ? 1 : 0;
      } else {
        int hash = order.hash(key);
        UnsafeRow old = belowThisBatch(key, hash);
        if (old != null) {   // a run of this batch's rows holds it: changed twice
          status = CHANGED;
          size += old == RowImage.DELETED ? 1 : 0;
        } else if (!mightHold(hash)) {   // no run holds it (the filters): a new key
          size++;
          status = ABSENT;
        } else {   // counted as new until settled
          size++;
          overlay.flag(key);
          unsettled++;
          status = UNCHANGED;
        }
      }
    }
    countChange();
    return status;
  }

  @Override
  public synchronized int remove(UnsafeRow key) {
    checkOpen();
    int status;
    if (overlay.remove(key) != null) {
      status = overlay.previousEpoch() == epoch() ? CHANGED : HELD;
      if (prefixes != null) {
        prefixes.remove(key);
      }
      // a tombstone even when no run holds the key: a put later in the batch must know the key was changed
      // (spills drop the tombstones no run needs, and a batch's end those of a store without runs); a key
      // still to settle stays so
      tombstones.put(key, NO_VALUE, overlay.previousFlag());
    } else {
      if (runs.isEmpty() || (tombstones.size() > 0 && tombstones.get(key) != null)) {
        return ABSENT;
      }
      UnsafeRow old = below(key, order.hash(key));
      if (old == null || old == RowImage.DELETED) {
        return ABSENT;
      }
      status = found.batch == batch ? CHANGED : HELD;
      tombstones.put(key, NO_VALUE);
    }
    size--;
    countChange();
    return status;
  }

  @Override
  public synchronized Iterator<UnsafeRowPair> iterator() {
    checkOpen();
    Scan scan = new Scan();
    scans.add(scan);
    return scan;
  }

  /**
   * The rows of one prefix, gathered when called (a few sessions per key; Spark removes and puts rows of
   * the prefix while it walks them): the heap's, then each run's newest record of every other key.
   */
  @Override
  public synchronized Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    checkOpen();
    if (prefixes == null) {
      throw new UnsupportedOperationException(
          "spark_state: prefixScan needs a store created with PrefixKeyScanStateEncoderSpec");
    }
    List<UnsafeRowPair> rows = new ArrayList<>();
    for (UnsafeRow key : prefixes.keys(prefixKey)) {
      UnsafeRow v = overlay.get(key);
      if (v != null) {
        rows.add(new UnsafeRowPair(key, v));
      }
    }
    if (!runs.isEmpty()) {
      int hash = order.hash(prefixKey);
      int keyGroup = order.keyGroup(hash);
      Set<UnsafeRow> seen = new HashSet<>();
      try {
        for (Run r : runs) {
          r.image.withSortKey(keyGroup, hash, (key, value) -> {
            if (!prefixes.hasPrefix(key, prefixKey) || !seen.add(key)) {
              return;   // another prefix of the same hash, or a newer run had the key
            }
            if (value != null && overlay.get(key) == null
                && (tombstones.size() == 0 || tombstones.get(key) == null)) {
              rows.add(new UnsafeRowPair(key, value));
            }
          });
        }
      } catch (RowImageException e) {
        throw damaged(e);
      }
    }
    return rows.iterator();
  }

  /**
   * A batch ends (or begins): iterators it left unfinished are forgotten (Spark need not drain them), the
   * heap rows spill if the budget is exceeded (a batch of fewer puts than a check interval spills here),
   * and later writes belong to a new batch.
   */
  @Override
  public synchronized void endBatch() {
    for (Scan s : scans) {
      s.forget();
    }
    scans.clear();
    if (runs.isEmpty() && tombstones.size() > 0) {
      tombstones = new RowArena(keyFields, 0, 16);   // nothing below to hide
    }
    maybeSpill();
    batch++;
    overlay.setEpoch(epoch());
    tombstones.setEpoch(epoch());
    scheduleMerge();
  }

  /**
   * Closes the runs and frees the budget. Any later use fails loudly (never answers "absent" for rows it
   * can no longer read): a store still holding the map fails its task, and the retry reloads.
   */
  @Override
  public synchronized void close() {
    if (closed) {
      return;
    }
    closed = true;
    heap.close();
    for (Scan s : scans) {
      s.forget();
    }
    scans.clear();
    cleanable.clean();   // the runs, then the reservations
    runs = List.of();
  }

  private void checkOpen() {
    if (closed) {
      throw new IllegalStateException("spark_state: this version's rows were dropped (the provider was unloaded "
          + "or reloaded the version); the task must be retried");
    }
  }

  private int epoch() {
    return (int) batch & 0xFF;
  }

  private void noteAdded(UnsafeRow key) {
    if (!scans.isEmpty()) {
      UnsafeRow copy = key.copy();
      for (Scan s : scans) {
        s.added.add(copy);
      }
    }
  }

  private void countChange() {
    if (++sinceCheck >= CHECK_EVERY) {
      sinceCheck = 0;
      maybeSpill();
    }
  }

  /**
   * Spark's {@code multiGet}: the keys are looked up in sort order (key group, hash), the order of the
   * blocks, so each block is read at most once however the batch is ordered; a remote image first fetches
   * the blocks of the whole batch in one request (as {@link #settle} does).
   */
  @Override
  public synchronized UnsafeRow[] getAll(UnsafeRow[] keys) {
    checkOpen();
    List<Object[]> sorted = new ArrayList<>(keys.length);
    for (int i = 0; i < keys.length; i++) {
      int h = order.hash(keys[i]);
      sorted.add(new Object[] {RowImage.sortKey(order.keyGroup(h), h), h, keys[i], i});
    }
    sorted.sort((a, b) -> Long.compare((Long) a[0], (Long) b[0]));
    if (!runs.isEmpty()) {
      prefetch(sorted);
    }
    UnsafeRow[] out = new UnsafeRow[keys.length];
    for (Object[] k : sorted) {
      UnsafeRow v = get((UnsafeRow) k[2]);
      out[(Integer) k[3]] = v == null ? null : v.copy();
    }
    return out;
  }

  // ------------------------------------------------------------------ runs

  /**
   * The key's newest record below the heap: its value, {@link RowImage#DELETED}, or null; {@link #found}
   * names the run that answered.
   */
  private UnsafeRow below(UnsafeRow key, int hash) {
    found = null;
    int keyGroup = order.keyGroup(hash);
    try {
      for (Run r : runs) {
        UnsafeRow v = r.image.get(keyGroup, hash, key);
        if (v != null) {
          found = r;
          return v;
        }
      }
    } catch (RowImageException e) {
      throw damaged(e);
    }
    return null;
  }

  /** The key's record in this batch's runs (those of its own rows), as {@link #below}; null if none holds it. */
  private UnsafeRow belowThisBatch(UnsafeRow key, int hash) {
    int keyGroup = order.keyGroup(hash);
    try {
      for (Run r : runs) {
        if (r.batch != batch) {
          break;   // this batch's runs are the newest
        }
        UnsafeRow v = r.image.get(keyGroup, hash, key);
        if (v != null) {
          return v;
        }
      }
    } catch (RowImageException e) {
      throw damaged(e);
    }
    return null;
  }

  /**
   * Settles the flagged keys: each was counted as new when put; those a run holds (and were there before
   * the batch) are counted out. They are looked up in sort order, so each block is read once.
   */
  private void settle() {
    if (unsettled == 0) {
      return;
    }
    List<Object[]> flagged = new ArrayList<>(unsettled);
    for (RowArena layer : new RowArena[] {overlay, tombstones}) {
      for (int i = 0, n = layer.slotCount(); i < n; i++) {
        UnsafeRow key = layer.keyAtSlot(i);
        if (key != null && layer.flagAtSlot(i)) {
          int h = order.hash(key);
          flagged.add(new Object[] {RowImage.sortKey(order.keyGroup(h), h), h, key});
        }
      }
    }
    flagged.sort((a, b) -> Long.compare((Long) a[0], (Long) b[0]));
    prefetch(flagged);
    for (Object[] f : flagged) {
      UnsafeRow v = below((UnsafeRow) f[2], (Integer) f[1]);
      if (v != null && v != RowImage.DELETED) {
        size--;
      }
    }
    settled(true);
  }

  /**
   * A remote image under the map (issue 38) fetches the blocks of the keys about to be settled in one request,
   * rather than one round trip per block as the lookups reach them. Nothing for local images.
   */
  private void prefetch(List<Object[]> flagged) {
    int[] groups = null;
    int[] hashes = null;
    try {
      for (Run r : runs) {
        if (!r.image.source().remote()) {
          continue;
        }
        if (groups == null) {
          groups = new int[flagged.size()];
          hashes = new int[flagged.size()];
          for (int i = 0; i < groups.length; i++) {
            hashes[i] = (Integer) flagged.get(i)[1];
            groups[i] = order.keyGroup(hashes[i]);
          }
        }
        r.image.prefetch(groups, hashes, groups.length);
      }
    } catch (RowImageException e) {
      throw damaged(e);
    }
  }

  /** Clears every flag (after {@link #settle}, or a walk that counted the keys anyway). */
  private void settled(boolean any) {
    if (unsettled == 0 && !any) {
      return;
    }
    for (RowArena layer : new RowArena[] {overlay, tombstones}) {
      for (int i = 0, n = layer.slotCount(); i < n; i++) {
        if (layer.keyAtSlot(i) != null && layer.flagAtSlot(i)) {
          layer.clearFlagAtSlot(i);
        }
      }
    }
    unsettled = 0;
  }

  /** Whether some run may hold the key (a tombstone is needed to hide it). */
  private boolean mayBeBelow(UnsafeRow key) {
    if (runs.isEmpty()) {
      return false;
    }
    int hash = order.hash(key);
    for (Run r : runs) {
      if (r.image.mightContain(hash)) {
        return true;
      }
    }
    return false;
  }

  private Run newRun(RowImage image, boolean bottom, long batchOfRun, Path file) {
    long bytes;
    try {
      bytes = Files.exists(file) ? Files.size(file) : 0;
    } catch (IOException e) {
      bytes = 0;
    }
    return new Run(image, bottom, batchOfRun, bytes, runCharges);
  }

  /** Tells the owner of a damaged file; returns the exception for the caller to throw. */
  private RowImageException damaged(RowImageException e) {
    onDamage.accept(e);
    return e;
  }

  // ------------------------------------------------------------------ spills

  private void maybeSpill() {
    long mine = heapBytes();
    heap.set(mine);
    MemoryBudget budget = engine.budget();
    if (!budget.overLimit()) {
      return;
    }
    engine.cache().trim();
    if (budget.used("runs") > budget.limit()) {   // spilling every row would not bring it under (buffers aside)
      budget.warnPinned("the indexes and filters of runs and row images (memory no spill gives back)");
    }
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
          LocalDirectory.get().spill(), e.toString());
    }
  }

  /**
   * Writes the heap rows, sorted, as new runs (this batch's rows in one, older ones in another) and empties
   * the heap. Older tombstones no run may need are dropped.
   */
  synchronized void spill() throws IOException {
    checkOpen();
    if (!sizeUnknown) {
      settle();   // the flagged keys leave the heap
    }
    long t0 = System.nanoTime();
    int no = (int) overlay.size();
    int nt = (int) tombstones.size();
    long[] sortKeys = new long[no + nt];
    int[] hashes = new int[no + nt];
    int[] slots = new int[no + nt];   // overlay slot, or -1 - tombstone slot
    boolean[] now = new boolean[no + nt];
    int n = 0;
    int current = 0;
    int e = epoch();
    for (int pass = 0; pass < 2; pass++) {
      RowArena layer = pass == 0 ? overlay : tombstones;
      for (int i = 0, count = layer.slotCount(); i < count; i++) {
        UnsafeRow key = layer.keyAtSlot(i);
        if (key == null) {
          continue;
        }
        int h = order.hash(key);
        boolean thisBatch = layer.epochAtSlot(i) == e;
        if (pass == 1 && !thisBatch && !mightHold(h)) {
          continue;   // no run holds the key: nothing to hide (this batch's tombstones say the key was changed)
        }
        sortKeys[n] = RowImage.sortKey(order.keyGroup(h), h);
        hashes[n] = h;
        slots[n] = pass == 0 ? i : -1 - i;
        now[n] = thisBatch;
        current += now[n] ? 1 : 0;
        n++;
      }
    }
    long[] exact = n == sortKeys.length ? sortKeys : java.util.Arrays.copyOf(sortKeys, n);
    int[] sorted = RowImageWriter.sortedPositions(exact);
    List<Run> made = new ArrayList<>(2);
    long written = 0;
    try {
      for (boolean thisBatch : new boolean[] {true, false}) {
        int count = thisBatch ? current : n - current;
        if (count == 0) {
          continue;
        }
        Path file = LocalDirectory.newSpillFile();
        try {
          try (RowImageWriter out = new RowImageWriter(file, RowImageWriter.DEFAULT_BLOCK_BYTES, true, count)) {
            for (int p : sorted) {
              if (now[p] != thisBatch) {
                continue;
              }
              int s = slots[p];
              UnsafeRow key = s >= 0 ? overlay.keyAtSlot(s) : tombstones.keyAtSlot(-1 - s);
              out.add((int) (exact[p] >>> 32), hashes[p], key, s >= 0 ? overlay.valueAtSlot(s) : null);
            }
            written += out.finish();
          }
          RowImage image = RowImage.open(file, keyFields, valueFields, engine.cache(), true);
          made.add(newRun(image, false, thisBatch ? batch : Run.MIXED, file));
        } finally {
          Files.deleteIfExists(file);   // open images read through their descriptor; nothing stays on disk
        }
      }
    } catch (IOException | RuntimeException ex) {
      for (Run r : made) {
        r.release();
      }
      throw ex;
    }
    List<Run> next = new ArrayList<>(made);
    next.addAll(runs);
    setRuns(List.copyOf(next));
    long freed = heapBytes();
    overlay = new RowArena(keyFields, valueFields, 16);
    tombstones = new RowArena(keyFields, 0, 16);
    if (prefixes != null) {
      prefixes.clear();
    }
    overlay.setEpoch(e);
    tombstones.setEpoch(e);
    unsettled = 0;   // settled above (or the size is unknown and will be counted whole)
    heap.set(heapBytes());
    spills++;
    spilledBytes += written;
    engine.spilled(freed, written);
    LOG.info("spark_state: spilled {} bytes of state rows to local disk ({} records, {} bytes in {} run(s); {} runs "
        + "now) in {} ms", freed, n, written, made.size(), runs.size(), (System.nanoTime() - t0) / 1_000_000L);
    scheduleMerge();
  }

  /** Whether some run's filter lets the hash through. */
  private boolean mightHold(int hash) {
    for (Run r : runs) {
      if (r.image.mightContain(hash)) {
        return true;
      }
    }
    return false;
  }

  // ------------------------------------------------------------------ merges

  /** Queues a merge on the engine's merge thread when one is due and none is queued. */
  private void scheduleMerge() {
    if (!merging && !closed && pickMerge() != null) {
      merging = true;
      engine.merge(this::mergeWhileDue);
    }
  }

  private void mergeWhileDue() {
    try {
      while (mergeOnce()) {
        // next candidate
      }
    } catch (RowImageException e) {
      onDamage.accept(e);
      LOG.warn("spark_state: a merge of local state files failed: {}", e.getMessage());
    } catch (IOException | RuntimeException e) {
      LOG.warn("spark_state: a merge of local state files failed (the runs stay as they are): {}", e.toString());
    } finally {
      synchronized (this) {
        merging = false;
        notifyAll();
      }
    }
  }

  /**
   * The runs to merge next, newest first, or null. Runs of the current batch merge only with each other
   * (so a key changed twice in a batch stays known); the bottom never merges. Within a group, the newest
   * runs merge while each next one is no larger than those before it together (a binary counter: a row is
   * rewritten about log2(rows / spill) times); past {@link #MAX_RUNS} the newest two merge anyway.
   */
  private List<Run> pickMerge() {
    List<Run> current = new ArrayList<>();
    List<Run> older = new ArrayList<>();
    for (Run r : runs) {
      if (!r.bottom) {
        (r.batch == batch ? current : older).add(r);
      }
    }
    for (List<Run> group : List.of(current, older)) {
      long sum = group.isEmpty() ? 0 : group.get(0).records();
      int j = 0;
      while (j + 1 < group.size() && group.get(j + 1).records() <= sum) {
        j++;
        sum += group.get(j).records();
      }
      if (j >= 1) {
        return group.subList(0, j + 1);
      }
    }
    if (current.size() + older.size() > MAX_RUNS) {
      return (older.size() >= 2 ? older : current).subList(0, 2);
    }
    return null;
  }

  /** One merge (on the merge thread): false when none is due or the store closed. */
  private boolean mergeOnce() throws IOException {
    List<Run> range;
    boolean dropTombstones;
    boolean thisBatch;
    long expected = 0;
    synchronized (this) {
      if (closed) {
        return false;
      }
      List<Run> picked = pickMerge();
      if (picked == null) {
        return false;
      }
      range = List.copyOf(picked);
      for (Run r : range) {
        r.retain();
        expected += r.records();
      }
      Run last = range.get(range.size() - 1);
      thisBatch = range.get(0).batch == batch;
      // nothing below: a tombstone hides nothing (but this batch's say that the batch changed the key)
      dropTombstones = runs.get(runs.size() - 1) == last && !thisBatch;
    }
    long t0 = System.nanoTime();
    Run merged = null;
    try {
      Path file = LocalDirectory.newSpillFile();
      long written;
      try {
        try (RowImageWriter out = new RowImageWriter(file, RowImageWriter.DEFAULT_BLOCK_BYTES, true, expected)) {
          MergedCursor in = new MergedCursor(range);
          while (in.next()) {
            if (in.value() != null || !dropTombstones) {
              out.add(in.keyGroup(), in.hash(), in.key(), in.value());
            }
          }
          written = out.finish();
        }
        RowImage image = RowImage.open(file, keyFields, valueFields, engine.cache(), true);
        merged = newRun(image, false, thisBatch ? range.get(0).batch : Run.MIXED, file);
      } finally {
        Files.deleteIfExists(file);
      }
      synchronized (this) {
        int at = closed ? -1 : indexOf(range);
        if (at < 0) {
          merged.release();
          return false;
        }
        List<Run> next = new ArrayList<>(runs.subList(0, at));
        next.add(merged);
        next.addAll(runs.subList(at + range.size(), runs.size()));
        setRuns(List.copyOf(next));
        for (Run r : range) {
          r.release();   // the store's reference
        }
        merges++;
        mergedBytes += written;
      }
      LOG.debug("spark_state: merged {} runs of {} records into one of {} bytes in {} ms", range.size(), expected,
          written, (System.nanoTime() - t0) / 1_000_000L);
      return true;
    } finally {
      for (Run r : range) {
        r.release();   // the merge's reference
      }
    }
  }

  /** Where {@code range} stands in {@link #runs}, contiguous and in order, or -1. */
  private int indexOf(List<Run> range) {
    int at = runs.indexOf(range.get(0));
    if (at < 0 || at + range.size() > runs.size()) {
      return -1;
    }
    for (int i = 0; i < range.size(); i++) {
      if (runs.get(at + i) != range.get(i)) {
        return -1;
      }
    }
    return at;
  }

  // ------------------------------------------------------------------ counting

  /** The exact key count of the layers as they are, by one walk of them (a restore that did not know it). */
  private long countKeys() {
    long n = 0;
    Scan scan = new Scan();
    scans.add(scan);
    while (scan.hasNext()) {
      scan.next();
      n++;
    }
    return n;
  }

  private static UnsafeRow emptyRow() {
    UnsafeRow row = new UnsafeRow(0);
    row.pointTo(new byte[0], 0);
    return row;
  }

  /** An iterator over the layers (see the class comment): the heap rows, then the runs merged. */
  private final class Scan implements Iterator<UnsafeRowPair> {
    /** Keys that entered the heap after this iterator started. */
    final Set<UnsafeRow> added = new HashSet<>();
    private final Iterator<UnsafeRowPair> upper = overlay.iterator();
    /** The runs this scan walks, held until it ends (in {@link #remains}: a map collected unclosed lets them go). */
    private List<Run> held;
    private final Hold hold;
    private final MergedCursor lower;
    private UnsafeRowPair next;
    private boolean done;
    /** Forgotten by its store ({@link #forget}) before it ended. */
    private boolean forgotten;

    Scan() {
      held = runs;
      hold = remains.hold(held);
      MergedCursor cursor = null;
      try {
        cursor = held.isEmpty() ? null : new MergedCursor(held);   // reads each run's first block
      } catch (RuntimeException e) {
        release();   // a damaged run: the scan never starts, and must not keep its runs open
        throw e instanceof RowImageException r ? damaged(r) : e;
      }
      lower = cursor;
    }

    @Override
    public boolean hasNext() {
      if (next == null && !done) {
        synchronized (LayeredMap.this) {
          if (forgotten) {
            // its runs are let go: going on would answer "no more rows" for the rows it can no longer read
            throw new IllegalStateException("spark_state: an iterator of a state store was read after its batch "
                + "ended or its version was dropped; the task must be retried");
          }
          next = advance();
          if (next == null) {
            done = true;
            scans.remove(this);
            release();
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

    /** The batch ended or the store closed before the scan did: it lets go of its runs and reads no more. */
    void forget() {
      forgotten = true;
      release();
    }

    /** Lets go of the runs (the scan ended, or was forgotten); a second call does nothing. */
    void release() {
      held = List.of();
      remains.release(hold);
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
      while (lower != null && !held.isEmpty() && lower.next()) {
        UnsafeRow value = lower.value();
        if (value == null) {
          continue;   // deleted in a newer run
        }
        UnsafeRow key = lower.key();
        UnsafeRow now = overlay.get(key);
        if (!added.isEmpty() && added.contains(key)) {
          if (now != null) {
            return new UnsafeRowPair(key, now);
          }
        } else if (now == null && (tombstones.size() == 0 || tombstones.get(key) == null)) {
          return new UnsafeRowPair(key, value);
        }
      }
      return null;
    }
  }

  /**
   * The answer below the heap of the last get that read there. Spark reads a key and then writes it
   * (aggregations, applyInPandasWithState): the put of that key takes its status from here instead of
   * flagging it for a second block read at commit. Valid while the runs and the batch are the ones it was
   * learnt under, and for that one key.
   */
  private static final class LastGet {
    private byte[] key;
    private List<Run> runs;
    private long batch;
    int status;
    /** With {@code CHANGED}: this batch's run holds a deletion of the key (a put adds it back). */
    boolean deletedThisBatch;

    void remember(UnsafeRow k, List<Run> runsNow, long batchNow, int statusNow, boolean deleted) {
      // a copy: getBytes() may answer the row's own buffer, which Spark reuses for the next key
      key = new byte[k.getSizeInBytes()];
      Platform.copyMemory(k.getBaseObject(), k.getBaseOffset(), key, Platform.BYTE_ARRAY_OFFSET, key.length);
      runs = runsNow;
      batch = batchNow;
      status = statusNow;
      deletedThisBatch = deleted;
    }

    /** Whether this is the answer for {@code k} now; it answers once. */
    boolean answers(UnsafeRow k, List<Run> runsNow, long batchNow) {
      byte[] mine = key;
      key = null;
      return mine != null && runs == runsNow && batch == batchNow && mine.length == k.getSizeInBytes()
          && ByteArrayMethods.arrayEquals(mine, Platform.BYTE_ARRAY_OFFSET, k.getBaseObject(), k.getBaseOffset(),
              mine.length);
    }
  }
}
