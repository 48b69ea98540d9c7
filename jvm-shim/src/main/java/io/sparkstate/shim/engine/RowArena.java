package io.sparkstate.shim.engine;

import java.util.Arrays;
import java.util.Iterator;
import java.util.NoSuchElementException;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.array.ByteArrayMethods;

/**
 * The in-heap rows of a {@link LayeredMap}: key → value rows with no Java objects per row:
 * each record {@code [keyLen][valueLen][key][value]} is appended to large on-heap pages, and an
 * open-addressing table of longs (key hash, record address) finds it. A record is never written again
 * once appended: a put appends a new one and the old one becomes garbage until the next compaction
 * copies the live records into fresh pages. So a row handed out (an {@link UnsafeRow} pointing into a
 * page) keeps its bytes for as long as anyone holds it, the page being an ordinary array the GC keeps
 * alive.
 *
 * <p>Every method is synchronized: a read store of another task may read while a store writes. The
 * rows handed out need no lock (their bytes never change).
 */
final class RowArena {
  /**
   * Largest page: 256 KiB, under half of G1's smallest region (1 MiB, the region size of heaps up to 2 GiB),
   * so pages are ordinary objects, not "humongous" ones G1 rounds up to whole regions (a 1 MiB page took
   * two regions: half the heap of the rows wasted). Record offsets in a page are 17 bits of 8-byte words
   * (at most 1 MiB); the system property {@code spark_state.arenaPageBytes} makes pages smaller (tests
   * cross many pages with little data).
   */
  static final int MAX_PAGE_BYTES = Math.max(16, Math.min(1 << 20, Integer.getInteger("spark_state.arenaPageBytes", 256 << 10)));
  private static final int MIN_PAGE_BYTES = Math.min(4096, MAX_PAGE_BYTES);
  private static final int HEADER = 8;
  /**
   * A record's first header word is its key length in the low 23 bits, the owner's flag in bit 23 (see
   * {@link #put(UnsafeRow, UnsafeRow, boolean)}), and the {@linkplain #setEpoch epoch} it was written in in
   * the high 8: keys are far below 8 MiB.
   */
  private static final int KEY_LENGTH_BITS = 23;
  static final int MAX_KEY_BYTES = (1 << KEY_LENGTH_BITS) - 1;
  private static final int FLAG = 1 << KEY_LENGTH_BITS;
  private static final int EPOCH_SHIFT = 24;
  /** A slot's low 32 bits: 0 empty, 1 removed, else a record address + 2 (page << 17 | word offset). */
  private static final int EMPTY = 0;
  private static final int REMOVED = 1;
  private static final int MAX_PAGES = (int) ((0xFFFFFFFFL - 2 - ((1L << 17) - 1)) >>> 17) + 1;
  /** Garbage below this many bytes is never compacted (small maps updated often); tests set it lower. */
  private static final long MIN_GARBAGE = Long.getLong("spark_state.arenaMinGarbage", 64 << 10);

  /** The index and the pages its addresses refer to; replaced whole by a rebuild (iterators notice). */
  private static final class Table {
    final long[] slots;
    byte[][] pages;

    Table(long[] slots, byte[][] pages) {
      this.slots = slots;
      this.pages = pages;
    }
  }

  private final int keyFields;
  private final int valueFields;
  private Table table;
  private int pageCount;
  /** Bytes used in the last page. */
  private int used;
  private int live;
  private int removed;
  private long liveBytes;
  private long garbageBytes;
  /** Bytes of the pages the current table holds (live records, garbage and unused tails). */
  private long pageBytes;
  /** The epoch new records are written in (8 bits): the owner's batch, so it can tell a key changed twice. */
  private int epoch;
  /** The epoch of the record the last put or remove replaced or removed (when it returned a value). */
  private int previousEpoch;
  /** Whether that record carried the flag. */
  private boolean previousFlag;

  RowArena(int keyFields, int valueFields, long expectedRows) {
    this.keyFields = keyFields;
    this.valueFields = valueFields;
    this.table = new Table(new long[capacityFor(expectedRows)], new byte[4][]);
  }

  private static int capacityFor(long rows) {
    long want = Math.max(16, rows * 4 / 3 + 1);
    if (want > (1 << 30)) {
      throw new IllegalStateException("spark_state: more than 2^29 keys in one partition");
    }
    return Integer.highestOneBit((int) want - 1) << 1;
  }

  public synchronized long size() {
    return live;
  }

  /**
   * Bytes the pages and the slots take: what the map holds on the heap (garbage and the unused tail of
   * the last page included; pages only rows handed out still reference are not).
   */
  public synchronized long bytes() {
    return pageBytes + (long) table.slots.length * 8;
  }

  public synchronized UnsafeRow get(UnsafeRow key) {
    int i = find(key, key.hashCode());
    return i < 0 ? null : valueAt(table.pages, ref(table.slots[i]));
  }

  /** Copies the key and value bytes in; returns the previous value or null. A replaced record's flag carries over. */
  public synchronized UnsafeRow put(UnsafeRow key, UnsafeRow value) {
    return put(key, value, false);
  }

  /**
   * As {@link #put(UnsafeRow, UnsafeRow)}, the new record flagged if {@code flag} or if the record it replaces
   * was (a bit of the owner's about the key, kept until {@link #clearFlagAtSlot}).
   */
  synchronized UnsafeRow put(UnsafeRow key, UnsafeRow value, boolean flag) {
    int h = key.hashCode();
    long[] slots = table.slots;
    int mask = slots.length - 1;
    int firstRemoved = -1;
    for (int i = home(h, mask); ; i = (i + 1) & mask) {
      int r = ref(slots[i]);
      if (r == EMPTY) {
        int at = firstRemoved >= 0 ? firstRemoved : i;
        if (firstRemoved >= 0) {
          removed--;
        }
        slots[at] = slot(h, append(key, value, flag));
        live++;
        if ((long) (live + removed) * 4 > (long) slots.length * 3) {
          rebuild(capacityFor(live), false);
        }
        return null;
      }
      if (r == REMOVED) {
        if (firstRemoved < 0) {
          firstRemoved = i;
        }
      } else if ((int) (slots[i] >>> 32) == h && keyEquals(table.pages, r, key)) {
        UnsafeRow old = valueAt(table.pages, r);
        int header = Platform.getInt(pageOf(table.pages, r), offsetOf(r));
        previousEpoch = header >>> EPOCH_SHIFT;
        previousFlag = (header & FLAG) != 0;
        garbageBytes += recordBytes(table.pages, r);
        liveBytes -= recordBytes(table.pages, r);
        slots[i] = slot(h, append(key, value, flag || previousFlag));
        maybeCompact();
        return old;
      }
    }
  }

  public synchronized UnsafeRow remove(UnsafeRow key) {
    int i = find(key, key.hashCode());
    if (i < 0) {
      return null;
    }
    int r = ref(table.slots[i]);
    UnsafeRow old = valueAt(table.pages, r);
    int header = Platform.getInt(pageOf(table.pages, r), offsetOf(r));
    previousEpoch = header >>> EPOCH_SHIFT;
    previousFlag = (header & FLAG) != 0;
    long n = recordBytes(table.pages, r);
    liveBytes -= n;
    garbageBytes += n;
    table.slots[i] = REMOVED;
    live--;
    removed++;
    maybeCompact();
    return old;
  }

  /**
   * Every live row once, in table order. Tolerates puts and removes while it runs (Spark removes
   * while it iterates): a removed key not yet reached is not returned, a value replaced before it is
   * reached is returned new, keys added meanwhile may or may not be. After a rebuild it finishes the
   * old table, checking each key against the current one.
   */
  public Iterator<UnsafeRowPair> iterator() {
    final Table start;
    synchronized (this) {
      start = table;
    }
    return new Iterator<UnsafeRowPair>() {
      private int pos;
      /** Found by hasNext, not ahead of it: a key removed before hasNext is asked is not returned. */
      private UnsafeRowPair next;

      private UnsafeRowPair advance() {
        synchronized (RowArena.this) {
          long[] slots = start.slots;
          while (pos < slots.length) {
            int r = ref(slots[pos++]);
            if (r == EMPTY || r == REMOVED) {
              continue;
            }
            if (start == table) {
              return new UnsafeRowPair(keyAt(table.pages, r), valueAt(table.pages, r));
            }
            UnsafeRow key = keyAt(start.pages, r);
            int i = find(key, (int) (slots[pos - 1] >>> 32));
            if (i >= 0) {
              return new UnsafeRowPair(key, valueAt(table.pages, ref(table.slots[i])));
            }
          }
          return null;
        }
      }

      @Override
      public boolean hasNext() {
        if (next == null) {
          next = advance();
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
    };
  }

  /**
   * The table's slot count: with {@link #keyAtSlot} and {@link #valueAtSlot}, a walk of the rows in an
   * order of the caller's choosing (a spill sorts them) without an object per row. The caller keeps
   * the arena unchanged meanwhile.
   */
  synchronized int slotCount() {
    return table.slots.length;
  }

  /** The key in slot {@code i}, or null when the slot holds none. */
  synchronized UnsafeRow keyAtSlot(int i) {
    int r = ref(table.slots[i]);
    return r == EMPTY || r == REMOVED ? null : keyAt(table.pages, r);
  }

  /** The value in slot {@code i}, or null when the slot holds none. */
  synchronized UnsafeRow valueAtSlot(int i) {
    int r = ref(table.slots[i]);
    return r == EMPTY || r == REMOVED ? null : valueAt(table.pages, r);
  }

  public Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    throw new UnsupportedOperationException(
        "spark_state: prefixScan needs a store created with PrefixKeyScanStateEncoderSpec");
  }

  // ------------------------------------------------------------------ table

  /** Records written from now on carry {@code epoch} (its low 8 bits). */
  synchronized void setEpoch(int epoch) {
    this.epoch = epoch & 0xFF;
  }

  /** The epoch (8 bits) of the record the last put or remove that returned a value replaced or removed. */
  synchronized int previousEpoch() {
    return previousEpoch;
  }

  /** Whether the last put or remove that returned a value replaced or removed a flagged record. */
  synchronized boolean previousFlag() {
    return previousFlag;
  }

  /** The epoch (8 bits) of the record in slot {@code i} (a slot that holds one). */
  synchronized int epochAtSlot(int i) {
    int r = ref(table.slots[i]);
    return Platform.getInt(pageOf(table.pages, r), offsetOf(r)) >>> EPOCH_SHIFT;
  }

  /** Whether the record in slot {@code i} (a slot that holds one) carries the flag. */
  synchronized boolean flagAtSlot(int i) {
    int r = ref(table.slots[i]);
    return (Platform.getInt(pageOf(table.pages, r), offsetOf(r)) & FLAG) != 0;
  }

  /** Flags the record of {@code key}; false when the arena does not hold the key. */
  synchronized boolean flag(UnsafeRow key) {
    int i = find(key, key.hashCode());
    if (i < 0) {
      return false;
    }
    int r = ref(table.slots[i]);
    byte[] page = pageOf(table.pages, r);
    long off = offsetOf(r);
    Platform.putInt(page, off, Platform.getInt(page, off) | FLAG);
    return true;
  }

  /** Clears the flag of the record in slot {@code i} (its key and value bytes do not change). */
  synchronized void clearFlagAtSlot(int i) {
    int r = ref(table.slots[i]);
    byte[] page = pageOf(table.pages, r);
    long off = offsetOf(r);
    Platform.putInt(page, off, Platform.getInt(page, off) & ~FLAG);
  }

  private static int keyLength(byte[] page, long off) {
    return Platform.getInt(page, off) & MAX_KEY_BYTES;
  }

  private static int home(int h, int mask) {
    int x = h * 0x9E3779B9;   // mixed: Spark partitioned these keys by a hash of the same family
    return (x ^ x >>> 16) & mask;
  }

  private static long slot(int h, int ref) {
    return (long) h << 32 | (ref & 0xFFFFFFFFL);
  }

  private static int ref(long slot) {
    return (int) slot;
  }

  private int find(UnsafeRow key, int h) {
    long[] slots = table.slots;
    int mask = slots.length - 1;
    for (int i = home(h, mask); ; i = (i + 1) & mask) {
      long s = slots[i];
      int r = ref(s);
      if (r == EMPTY) {
        return -1;
      }
      if (r != REMOVED && (int) (s >>> 32) == h && keyEquals(table.pages, r, key)) {
        return i;
      }
    }
  }

  private void maybeCompact() {
    if (garbageBytes > Math.max(liveBytes, MIN_GARBAGE)) {
      rebuild(capacityFor(live), true);
    } else if ((long) (live + removed) * 4 > (long) table.slots.length * 3) {
      rebuild(capacityFor(live), false);
    }
  }

  /** A new table of {@code capacity} slots without removed slots; with {@code compact}, fresh pages too. */
  private void rebuild(int capacity, boolean compact) {
    Table old = table;
    long total = liveBytes;
    long[] slots = new long[capacity];
    int mask = capacity - 1;
    if (compact) {
      table = new Table(slots, new byte[4][]);
      pageCount = 0;
      used = 0;
      pageBytes = 0;
      liveBytes = 0;
      garbageBytes = 0;
    } else {
      table = new Table(slots, old.pages);
    }
    for (long s : old.slots) {
      int r = ref(s);
      if (r == EMPTY || r == REMOVED) {
        continue;
      }
      if (compact) {
        int n = recordBytes(old.pages, r);
        int to = reserve(n, total);
        Platform.copyMemory(pageOf(old.pages, r), offsetOf(r), table.pages[pageCount - 1],
            Platform.BYTE_ARRAY_OFFSET + to, n);
        r = address(pageCount - 1, to);
        liveBytes += n;
      }
      int h = (int) (s >>> 32);
      int i = home(h, mask);
      while (slots[i] != 0) {
        i = (i + 1) & mask;
      }
      slots[i] = slot(h, r);
    }
    removed = 0;
  }

  // ------------------------------------------------------------------ pages

  private static int address(int page, int offset) {
    return (page << 17 | offset >>> 3) + 2;
  }

  private static byte[] pageOf(byte[][] pages, int ref) {
    return pages[(ref - 2) >>> 17];
  }

  private static long offsetOf(int ref) {
    return Platform.BYTE_ARRAY_OFFSET + ((long) ((ref - 2) & ((1 << 17) - 1)) << 3);
  }

  private static int recordBytes(byte[][] pages, int ref) {
    byte[] page = pageOf(pages, ref);
    long off = offsetOf(ref);
    return align(HEADER + keyLength(page, off) + Platform.getInt(page, off + 4));
  }

  private static int align(int n) {
    return (n + 7) & ~7;
  }

  private boolean keyEquals(byte[][] pages, int ref, UnsafeRow key) {
    byte[] page = pageOf(pages, ref);
    long off = offsetOf(ref);
    int n = keyLength(page, off);
    return n == key.getSizeInBytes()
        && ByteArrayMethods.arrayEquals(page, off + HEADER, key.getBaseObject(), key.getBaseOffset(), n);
  }

  private UnsafeRow keyAt(byte[][] pages, int ref) {
    byte[] page = pageOf(pages, ref);
    long off = offsetOf(ref);
    UnsafeRow row = new UnsafeRow(keyFields);
    row.pointTo(page, off + HEADER, keyLength(page, off));
    return row;
  }

  private UnsafeRow valueAt(byte[][] pages, int ref) {
    byte[] page = pageOf(pages, ref);
    long off = offsetOf(ref);
    int keyLen = keyLength(page, off);
    UnsafeRow row = new UnsafeRow(valueFields);
    row.pointTo(page, off + HEADER + keyLen, Platform.getInt(page, off + 4));
    return row;
  }

  /** Appends a record; returns its address. */
  private int append(UnsafeRow key, UnsafeRow value, boolean flag) {
    int k = key.getSizeInBytes();
    int v = value.getSizeInBytes();
    if (k > MAX_KEY_BYTES) {
      throw new IllegalArgumentException("spark_state: a state key of " + k + " bytes; keys up to " + MAX_KEY_BYTES
          + " bytes are supported");
    }
    int n = align(HEADER + k + v);
    int to = reserve(n, 0);
    byte[] page = table.pages[pageCount - 1];
    long off = Platform.BYTE_ARRAY_OFFSET + to;
    Platform.putInt(page, off, k | (flag ? FLAG : 0) | epoch << EPOCH_SHIFT);
    Platform.putInt(page, off + 4, v);
    Platform.copyMemory(key.getBaseObject(), key.getBaseOffset(), page, off + HEADER, k);
    Platform.copyMemory(value.getBaseObject(), value.getBaseOffset(), page, off + HEADER + k, v);
    liveBytes += n;
    return address(pageCount - 1, to);
  }

  /**
   * Room for {@code n} bytes in the last page, starting a new page when needed (pages double from 4 KiB
   * to 1 MiB, or {@code hint} bytes when known; a larger record gets a page of its own). Returns the offset.
   */
  private int reserve(int n, long hint) {
    if (pageCount > 0 && used + n <= table.pages[pageCount - 1].length) {
      int at = used;
      used += n;
      return at;
    }
    if (pageCount == MAX_PAGES) {
      throw new IllegalStateException("spark_state: a partition's state exceeds " + MAX_PAGES + " pages");
    }
    long size = pageCount == 0 ? Math.max(MIN_PAGE_BYTES, hint) : (long) table.pages[pageCount - 1].length * 2;
    size = Math.max(n, Math.min(MAX_PAGE_BYTES, size));
    if (pageCount == table.pages.length) {
      table.pages = Arrays.copyOf(table.pages, pageCount * 2);
    }
    table.pages[pageCount++] = new byte[(int) size];
    pageBytes += size;
    used = n;
    return 0;
  }
}
