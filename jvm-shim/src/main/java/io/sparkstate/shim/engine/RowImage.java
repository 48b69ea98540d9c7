package io.sparkstate.shim.engine;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicReferenceArray;
import java.util.zip.CRC32;

import com.github.luben.zstd.ZstdDecompressCtx;
import com.github.luben.zstd.ZstdException;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.array.ByteArrayMethods;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A row image opened for lookups: a state file of UnsafeRow records sorted by (key group, hash)
 * in small blocks (layout: issue 23's row image spec, "File layout"). Only the block index is on
 * the heap (a few bytes per block); blocks are read on demand, verified and decompressed into the
 * executor's {@link BlockCache}, and rows point straight into them. Nothing is memory-mapped, so what
 * the image keeps resident is the index plus its share of the cache.
 *
 * <p>Its bytes come from a {@link BlockSource}: a local file ({@link FileSource}), or an image on remote
 * checkpoint storage read by byte range through the executor's {@link ImageCache}. A lookup reads one
 * block's bytes on a cache miss; a cursor up to {@link #READ_AHEAD} bytes at a time. A remote image of
 * format version 3 opens from its page directory alone ({@link Pages}): each page of the block index is
 * read, and checked, when a lookup first needs it, and the rest with the key filter in the background.
 * A remote image's key filter arrives in the background (until then every key is looked up in its block),
 * and a block or index page that fails a check is read once more from the checkpoint itself before it is
 * called corrupt: a damaged local copy costs a fetch, never a wrong answer.
 *
 * <p>Thread-safe. Every structural fact about a block is checked once, when it is loaded (lengths,
 * order, record count), so lookups read the block with unchecked accesses that stay in bounds; a
 * failed check is a {@link RowImageException} naming the file and the block.
 */
final class RowImage implements Closeable {
  private static final Logger LOG = LoggerFactory.getLogger(RowImage.class);
  static final byte[] MAGIC = "SPKSTRI".getBytes(StandardCharsets.US_ASCII);
  /**
   * The newest version this code reads (1: no filter; 2: a key filter may follow the index; 3: a page directory
   * of the index may follow the filter). The worker writes version 3; spill runs ({@link RowImageWriter}) are
   * version 2, read whole from a local disk.
   */
  static final int VERSION = 3;
  static final int TRAILER_BYTES = 40;
  static final int INDEX_ENTRY_BYTES = 40;
  static final int PAGE_ENTRY_BYTES = 32;
  static final int PAGES_HEADER_BYTES = 16;
  /** Bytes either side of the guessed place of a lookup's block fetched with its index page ({@link #readPageAndGuess}). */
  static final long GUESS_BYTES = 8 << 10;
  static final int RECORD_HEADER = 16;
  /** About how many blocks' first and last hash a key filter must admit at open ({@link #firstBlockDenied}). */
  static final int FILTER_CHECKS = 1024;
  static final int CODEC_RAW = 0;
  static final int CODEC_ZSTD = 1;
  static final int FLAG_TOMBSTONES = 1;
  static final int FLAG_FILTER = 2;
  static final int FLAG_PAGED = 4;
  /** Largest stored or raw block (a Java array, less a margin). */
  static final long MAX_BLOCK = Integer.MAX_VALUE - 16;
  /** A lookup scans at most this many records of a block after a binary search of its restarts. */
  static final int RESTART_INTERVAL = 8;
  /**
   * A cursor reads the blocks it needs this many bytes at a time (one read, not one per small block);
   * the system property {@code spark_state.rowImageReadAhead} makes it smaller (tests cross many reads).
   */
  static final int READ_AHEAD = Math.max(1, Integer.getInteger("spark_state.rowImageReadAhead", 256 << 10));

  /** {@link #get}'s answer for a key this image holds as deleted: compare by identity, never hand it to Spark. */
  static final UnsafeRow DELETED = new UnsafeRow(0);

  static {
    DELETED.pointTo(new byte[0], 0);
  }

  private final Path path;
  private final BlockSource source;
  /** How messages name the file. */
  private final String name;
  private final BlockCache cache;
  private final boolean verifyChecksums;
  private final int keyFields;
  private final int valueFields;
  private final long records;
  private final int codec;
  private final boolean tombstones;
  /**
   * The file's key filter, or null (a version-1 file, one written without, or a remote image's whose words
   * are still on their way: {@link #pendingFilter}).
   */
  private volatile KeyFilter filter;
  /** A filter to load in the background (start, words, hashes, crc), or null. */
  private volatile long[] pendingFilter;
  private final int blockCount;
  private final long[] firstKey;
  private final long[] lastKey;
  /** Where each block starts; one more entry: where the index starts (blocks follow each other). */
  private final long[] offset;
  private final long indexOffset;
  /** The index pages not read yet (a remote version-3 image), or null: the whole index is in the arrays. */
  private volatile Pages pages;
  private final int[] rawLength;
  private final int[] crc;
  private final int[] blockRecords;
  /** The cached entry of each block (null: not cached); owned by {@link BlockCache}. */
  final AtomicReferenceArray<BlockCache.Entry> slots;
  private volatile boolean closed;

  /** The sort key of a record: key group, then hash as unsigned (non-negative since key groups are). */
  static long sortKey(int keyGroup, int hash) {
    return (long) keyGroup << 32 | (hash & 0xFFFFFFFFL);
  }

  static void checkByteOrder() {
    if (ByteOrder.nativeOrder() != ByteOrder.LITTLE_ENDIAN) {
      throw new UnsupportedOperationException("spark_state: row images need a little-endian platform");
    }
  }

  /**
   * Opens a row image, checking its trailer and index. {@code verifyChecksums}: check each block's
   * CRC-32 before using it (the provider option verifyChecksums).
   */
  public static RowImage open(Path path, int keyFields, int valueFields, BlockCache cache, boolean verifyChecksums)
      throws IOException {
    checkByteOrder();
    return open(new FileSource(path), keyFields, valueFields, cache, verifyChecksums);
  }

  /** Opens a row image whose bytes {@code source} reads; closes the source if the image cannot be opened. */
  static RowImage open(BlockSource source, int keyFields, int valueFields, BlockCache cache, boolean verifyChecksums)
      throws IOException {
    checkByteOrder();
    try {
      return new RowImage(source, keyFields, valueFields, cache, verifyChecksums);
    } catch (RuntimeException | IOException e) {
      source.close();
      throw e;
    }
  }

  private RowImage(BlockSource source, int keyFields, int valueFields, BlockCache cache, boolean verifyChecksums)
      throws IOException {
    this.source = source;
    this.path = source.path();
    this.name = source.name();
    this.keyFields = keyFields;
    this.valueFields = valueFields;
    this.cache = cache;
    this.verifyChecksums = verifyChecksums;
    long size = source.size();
    if (size < TRAILER_BYTES) {
      throw RowImageException.corrupt(name, "truncated: " + size + " bytes, less than its " + TRAILER_BYTES
          + "-byte trailer");
    }
    ByteBuffer trailer = ByteBuffer.wrap(readAt(size - TRAILER_BYTES, TRAILER_BYTES)).order(ByteOrder.LITTLE_ENDIAN);
    for (int i = 0; i < MAGIC.length; i++) {
      if (trailer.get(32 + i) != MAGIC[i]) {
        throw RowImageException.corrupt(name, "no row image trailer (truncated, or not a row image)");
      }
    }
    int version = trailer.get(39) & 0xFF;
    if (version > VERSION) {
      throw RowImageException.newer(name, "row image format version " + version + ", this one reads " + VERSION);
    }
    if (version < 1) {
      throw RowImageException.corrupt(name, "row image format version " + version);
    }
    long indexOffset = trailer.getLong(0);
    this.records = trailer.getLong(8);
    long blocks = trailer.getInt(16) & 0xFFFFFFFFL;
    int indexCrc = trailer.getInt(20);
    this.codec = trailer.getInt(24);
    int flags = trailer.getInt(28);
    if (codec != CODEC_RAW && codec != CODEC_ZSTD) {
      throw RowImageException.newer(name, "block codec " + codec);
    }
    int known = version >= 3 ? FLAG_TOMBSTONES | FLAG_FILTER | FLAG_PAGED
        : version == 2 ? FLAG_TOMBSTONES | FLAG_FILTER : FLAG_TOMBSTONES;
    if ((flags & ~known) != 0) {
      throw RowImageException.newer(name, "flags 0x" + Integer.toHexString(flags));
    }
    this.tombstones = (flags & FLAG_TOMBSTONES) != 0;
    long directoryBytes = 0;
    int pageCount = 0;
    int perPage = 0;
    int directoryCrc = 0;
    if ((flags & FLAG_PAGED) != 0) {
      if (size < TRAILER_BYTES + PAGES_HEADER_BYTES) {
        throw RowImageException.corrupt(name, "truncated: no room for its page directory's header");
      }
      ByteBuffer header = ByteBuffer.wrap(readAt(size - TRAILER_BYTES - PAGES_HEADER_BYTES, PAGES_HEADER_BYTES))
          .order(ByteOrder.LITTLE_ENDIAN);
      pageCount = header.getInt(0);
      perPage = header.getInt(4);
      directoryCrc = header.getInt(8);
      if (pageCount < 0 || perPage < 1 || header.getInt(12) != 0
          || (blocks + perPage - 1) / perPage != pageCount) {
        throw RowImageException.corrupt(name, "a page directory header of " + pageCount + " pages of " + perPage
            + " entries for " + blocks + " blocks");
      }
      directoryBytes = (long) PAGE_ENTRY_BYTES * pageCount + PAGES_HEADER_BYTES;
    }
    long filterBytes = 0;
    int filterWords = 0;
    int filterHashes = 0;
    int filterCrc = 0;
    if ((flags & FLAG_FILTER) != 0) {
      if (size < TRAILER_BYTES + directoryBytes + KeyFilter.HEADER_BYTES) {
        throw RowImageException.corrupt(name, "truncated: no room for its filter header");
      }
      ByteBuffer header = ByteBuffer.wrap(readAt(size - TRAILER_BYTES - directoryBytes - KeyFilter.HEADER_BYTES,
          KeyFilter.HEADER_BYTES)).order(ByteOrder.LITTLE_ENDIAN);
      filterWords = header.getInt(0);
      filterHashes = header.getInt(4);
      filterCrc = header.getInt(8);
      if (filterWords <= 0 || filterWords > (Integer.MAX_VALUE >> 3) || filterHashes < 1 || filterHashes > 30) {
        throw RowImageException.corrupt(name, "a filter header of " + filterWords + " words and " + filterHashes
            + " hashes");
      }
      filterBytes = 8L * filterWords + KeyFilter.HEADER_BYTES;
    }
    if (indexOffset < 0
        || blocks * INDEX_ENTRY_BYTES + filterBytes + directoryBytes + TRAILER_BYTES != size - indexOffset) {
      throw RowImageException.corrupt(name, "truncated or damaged: the trailer puts " + blocks + " index entries at "
          + indexOffset + " in a file of " + size + " bytes");
    }
    this.blockCount = (int) blocks;
    this.indexOffset = indexOffset;
    this.firstKey = new long[blockCount];
    this.lastKey = new long[blockCount];
    this.offset = new long[blockCount + 1];
    this.rawLength = new int[blockCount];
    this.crc = new int[blockCount];
    this.blockRecords = new int[blockCount];
    if (directoryBytes > 0 && source.remote()) {   // the index arrives page by page, as lookups need it
      long at = size - TRAILER_BYTES - directoryBytes;
      byte[] directory = readAt(at, (int) directoryBytes - PAGES_HEADER_BYTES);
      Pages p = new Pages(directory, pageCount, perPage, directoryCrc);
      this.pages = pageCount == 0 ? null : p;
    } else {
      byte[] indexBytes = readAt(indexOffset, blockCount * INDEX_ENTRY_BYTES);
      if (crc32(indexBytes) != indexCrc) {
        throw RowImageException.corrupt(name, "the block index fails its CRC-32");
      }
      long total = readEntries(ByteBuffer.wrap(indexBytes).order(ByteOrder.LITTLE_ENDIAN), 0, blockCount, 0,
          indexOffset);
      if (total != records) {
        throw RowImageException.corrupt(name, "the trailer counts " + records + " records, the index " + total);
      }
    }
    this.slots = new AtomicReferenceArray<>(blockCount);
    if (filterWords > 0) {
      long start = indexOffset + (long) blockCount * INDEX_ENTRY_BYTES;
      if (source.remote()) {   // a few bytes per key: not before the first lookup
        this.pendingFilter = new long[] {start, filterWords, filterHashes, filterCrc};
      } else {
        KeyFilter f = readFilter(start, filterWords, filterHashes, filterCrc, readAt(start, 8 * filterWords));
        int b = firstBlockDenied(f);
        if (b >= 0) {
          throw RowImageException.corrupt(name, "the key filter rules out a key of block " + b + " (its header "
              + "is damaged)");
        }
        this.filter = f;
      }
    }
  }

  private KeyFilter readFilter(long start, int words, int hashes, int crc, byte[] bytes) {
    if (crc32(bytes) != crc) {
      throw RowImageException.corrupt(name, "the key filter fails its CRC-32");
    }
    long[] bits = new long[words];
    ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().get(bits);
    return new KeyFilter(bits, hashes);
  }

  /**
   * Loads a remote image's key filter (the source's background job after {@link #open}): its CRC checked,
   * and asked for the first and last hash of blocks spread over the index ({@link #firstBlockDenied}: a filter
   * that denies one is damaged). One that fails either check, read again from the checkpoint, is never used: every key is
   * then looked up in its block, which is slower and as right. A filter that cannot be fetched is tried
   * again by the next open of the image.
   */
  void loadPendingFilter() {
    long[] p = pendingFilter;
    if (p == null || closed) {
      return;
    }
    long start = p[0];
    int words = (int) p[1];
    int n = 8 * words;
    KeyFilter f;
    try {
      readAllPages();   // the filter is checked against blocks' first and last hashes (and lookups need them all)
      f = checkedFilter(start, words, (int) p[2], (int) p[3], readAt(start, n));
      if (f == null) {
        byte[] again = source.reread(start, n);
        f = again == null ? null : checkedFilter(start, words, (int) p[2], (int) p[3], again);
      }
    } catch (IOException | RuntimeException e) {
      if (!closed) {
        LOG.warn("spark_state: cannot fetch the key filter of the row image {} ({}); looking every key up in its "
            + "block", name, e.toString());
      }
      return;
    }
    if (f == null) {
      LOG.warn("spark_state: the key filter of the row image {} fails its checks in the checkpoint too; looking "
          + "every key up in its block", name);
    } else {
      filter = f;
    }
    pendingFilter = null;
  }

  /** The filter of these bytes when they pass its CRC and admit the hashes the index names, else null. */
  private KeyFilter checkedFilter(long start, int words, int hashes, int crc, byte[] bytes) {
    if (crc32(bytes) != crc) {
      return null;
    }
    KeyFilter f = readFilter(start, words, hashes, crc, bytes);
    return firstBlockDenied(f) < 0 ? f : null;
  }

  /**
   * The first of about {@link #FILTER_CHECKS} blocks spread over the image (the first and last among them) whose first
   * or last record's hash the filter denies, or -1. The CRC covers the filter's words, not its header's k; a k
   * raised by damage denies each of those hashes with a chance of at least one half, so a thousand blocks catch
   * it surely. Every block was 240,000 random probes of a 12 MB filter in the open of a 10M-row image.
   */
  private int firstBlockDenied(KeyFilter f) {
    int step = Math.max(1, (blockCount + FILTER_CHECKS - 1) / FILTER_CHECKS);
    for (int b = 0; b < blockCount; b += step) {
      if (denies(f, b)) {
        return b;
      }
    }
    return blockCount > 0 && denies(f, blockCount - 1) ? blockCount - 1 : -1;
  }

  private boolean denies(KeyFilter f, int b) {
    return !f.mightContain((int) firstKey[b]) || !f.mightContain((int) lastKey[b]);
  }

  /**
   * Reads and checks index entries of blocks [b0, b1) from {@code index} (entry b0 at byte 0): the first block
   * starts at {@code start0}, the last ends at {@code end}; answers their record count. Block b0's entry is
   * compared with the one before it only within the range (a page's with the previous page's through the
   * directory, which is checked in order at open).
   */
  private long readEntries(ByteBuffer index, int b0, int b1, long start0, long end) {
    if (b0 == b1 && start0 != end) {
      throw RowImageException.corrupt(name, "the blocks end at " + start0 + ", the index starts at " + end);
    }
    long total = 0;
    offset[b0] = start0;
    for (int b = b0; b < b1; b++) {
      int at = (b - b0) * INDEX_ENTRY_BYTES;
      firstKey[b] = index.getLong(at);
      lastKey[b] = index.getLong(at + 8);
      long start = index.getLong(at + 16);
      long stored = index.getInt(at + 24) & 0xFFFFFFFFL;
      long raw = index.getInt(at + 28) & 0xFFFFFFFFL;
      crc[b] = index.getInt(at + 32);
      long n = index.getInt(at + 36) & 0xFFFFFFFFL;
      String bad = null;
      if (start != offset[b]) {
        bad = "the block starts at " + start + ", not right after the previous one (" + offset[b] + ")";
      } else if (stored == 0 || stored > MAX_BLOCK || raw < RECORD_HEADER || raw > MAX_BLOCK || raw % 8 != 0
          || (codec == CODEC_RAW && stored != raw)) {
        bad = "lengths " + stored + " stored, " + raw + " raw";
      } else if (n == 0 || n > raw / RECORD_HEADER) {
        bad = n + " records in " + raw + " bytes";
      } else if (firstKey[b] < 0 || lastKey[b] < firstKey[b] || (b > b0 && firstKey[b] < lastKey[b - 1])) {
        bad = "sort keys out of order";
      }
      if (bad != null) {
        throw RowImageException.corrupt(name, b, blockCount, "index entry: " + bad);
      }
      if (b + 1 < b1) {
        offset[b + 1] = start + stored;
      } else if (start + stored != end) {
        throw RowImageException.corrupt(name, "the blocks end at " + (start + stored) + ", the index (or the next "
            + "index page's first block) starts at " + end);
      }
      rawLength[b] = (int) raw;
      blockRecords[b] = (int) n;
      total += n;
    }
    offset[b1] = end;
    return total;
  }

  Path path() {
    return path;
  }

  /** Records in the file, tombstones included. */
  public long rows() {
    return records;
  }

  int blockCount() {
    return blockCount;
  }

  public boolean hasTombstones() {
    return tombstones;
  }

  boolean isClosed() {
    return closed;
  }

  /**
   * Heap the open image keeps outside the block cache: the index, the cache slots, the filter (one on its way
   * too) and the page directory while pages are missing.
   */
  long heapBytes() {
    KeyFilter f = filter;
    long[] p = pendingFilter;
    long filterBytes = f != null ? f.bytes() : p != null ? 16L + 8L * p[1] : 0;
    Pages missing = pages;
    long directory = missing == null ? 0 : 6L * 16 + 40L * missing.count;
    return 6L * 16 + 8L * (3L * blockCount + 1) + 4L * 4 * blockCount + filterBytes + directory;
  }

  /** Whether the file has a key filter loaded (a version-1 file has none; a remote image's may be on its way). */
  boolean hasFilter() {
    return filter != null;
  }

  /** False only if the file holds no record of this hash (always true without a filter). */
  boolean mightContain(int hash) {
    KeyFilter f = filter;
    return f == null || f.mightContain(hash);
  }

  /**
   * The blocks that keys of these key groups and hashes would be read from, and are not in the block cache,
   * are fetched at once if the source is remote (one request for a batch of keys, rather than a round trip
   * per key); their lookups then read local bytes. Nothing for a local image.
   */
  void prefetch(int[] keyGroups, int[] hashes, int n) {
    if (!source.remote() || closed) {
      return;
    }
    KeyFilter f = filter;
    long[] sorted = new long[n];
    int m = 0;
    for (int i = 0; i < n; i++) {
      if (f == null || f.mightContain(hashes[i])) {
        sorted[m++] = sortKey(keyGroups[i], hashes[i]);
      }
    }
    Arrays.sort(sorted, 0, m);
    readPagesOf(sorted, m);
    long[] from = new long[Math.min(m, blockCount) + 1];
    long[] to = new long[from.length];
    int ranges = 0;
    int last = -1;
    for (int i = 0; i < m; i++) {
      for (int b = Math.max(firstBlockEndingAtOrAfter(sorted[i]), last + 1); b < blockCount
          && firstKeyOf(b) <= sorted[i]; b++) {
        last = b;
        if (slots.get(b) != null) {
          continue;
        }
        entry(b);
        if (ranges > 0 && to[ranges - 1] == offset[b]) {
          to[ranges - 1] = offset[b + 1];
        } else {
          if (ranges == from.length) {
            from = Arrays.copyOf(from, ranges * 2);
            to = Arrays.copyOf(to, ranges * 2);
          }
          from[ranges] = offset[b];
          to[ranges++] = offset[b + 1];
        }
      }
    }
    if (ranges == 0) {
      return;
    }
    try {
      source.prefetch(Arrays.copyOf(from, ranges), Arrays.copyOf(to, ranges));
    } catch (IOException e) {
      throw RowImageException.unfetched(name, e);
    } finally {
      source.blocksRead();
    }
  }

  /**
   * The value of {@code key} (hash {@code hash}, key group {@code keyGroup}): a row pointing into a
   * cached block (its bytes never change), {@link #DELETED} if this image holds the key as deleted,
   * or null if it does not hold the key. A key the filter rules out costs no block.
   */
  UnsafeRow get(int keyGroup, int hash, UnsafeRow key) {
    KeyFilter f = filter;
    if (f != null && !f.mightContain(hash)) {
      return null;
    }
    long s = sortKey(keyGroup, hash);
    int n = key.getSizeInBytes();
    Object keyBase = key.getBaseObject();
    long keyOffset = key.getBaseOffset();
    for (int b = firstBlockEndingAtOrAfter(s); b < blockCount && firstKeyOf(b) <= s; b++) {
      BlockCache.Entry block = block(b);
      byte[] bytes = block.bytes;
      long at = Platform.BYTE_ARRAY_OFFSET + block.restarts[lastRestartBefore(block.restartKeys, s)];
      long end = Platform.BYTE_ARRAY_OFFSET + rawLength[b];
      while (at < end) {
        long k = sortKey(Platform.getInt(bytes, at), Platform.getInt(bytes, at + 4));
        if (k > s) {
          return null;
        }
        int keyLength = Platform.getInt(bytes, at + 8);
        int valueLength = Platform.getInt(bytes, at + 12);
        if (k == s && keyLength == n
            && ByteArrayMethods.arrayEquals(bytes, at + RECORD_HEADER, keyBase, keyOffset, n)) {
          if (valueLength < 0) {
            return DELETED;
          }
          UnsafeRow value = new UnsafeRow(valueFields);
          value.pointTo(bytes, at + RECORD_HEADER + keyLength, valueLength);
          return value;
        }
        at += RECORD_HEADER + keyLength + Math.max(valueLength, 0);
      }
    }
    return null;
  }

  /** Receives the records of one sort key ({@link #withSortKey}); value null: a tombstone. */
  interface RecordSink {
    void accept(UnsafeRow key, UnsafeRow value);
  }

  /**
   * Every record of sort key ({@code keyGroup}, {@code hash}), through the block cache: a prefix-scan
   * store keeps all keys of one prefix under one hash, so these are that prefix's rows (and, rarely,
   * another prefix's with the same hash). The filter rules out hashes the file does not hold.
   */
  void withSortKey(int keyGroup, int hash, RecordSink sink) {
    KeyFilter f = filter;
    if (f != null && !f.mightContain(hash)) {
      return;
    }
    long s = sortKey(keyGroup, hash);
    for (int b = firstBlockEndingAtOrAfter(s); b < blockCount && firstKeyOf(b) <= s; b++) {
      BlockCache.Entry block = block(b);
      byte[] bytes = block.bytes;
      long at = Platform.BYTE_ARRAY_OFFSET + block.restarts[lastRestartBefore(block.restartKeys, s)];
      long end = Platform.BYTE_ARRAY_OFFSET + rawLength[b];
      while (at < end) {
        long k = sortKey(Platform.getInt(bytes, at), Platform.getInt(bytes, at + 4));
        if (k > s) {
          return;
        }
        int keyLength = Platform.getInt(bytes, at + 8);
        int valueLength = Platform.getInt(bytes, at + 12);
        if (k == s) {
          UnsafeRow key = new UnsafeRow(keyFields);
          key.pointTo(bytes, at + RECORD_HEADER, keyLength);
          UnsafeRow value = null;
          if (valueLength >= 0) {
            value = new UnsafeRow(valueFields);
            value.pointTo(bytes, at + RECORD_HEADER + keyLength, valueLength);
          }
          sink.accept(key, value);
        }
        at += RECORD_HEADER + keyLength + Math.max(valueLength, 0);
      }
    }
  }

  /** Every record in sort order; see {@link Cursor}. Reads blocks in file order and does not fill the cache. */
  Cursor cursor() {
    readAllPages();
    return new Cursor();
  }

  /**
   * Walks the records of an image in sort order: {@link #next} moves to the next record, the other
   * methods describe the current one. Rows it hands out point into a block array of their own (never
   * reused), so they stay valid after the cursor moves on. Not thread-safe (one cursor per reader).
   */
  final class Cursor {
    private int block = -1;
    private byte[] bytes;
    private long at;
    private long next = Platform.BYTE_ARRAY_OFFSET;
    private long end = Platform.BYTE_ARRAY_OFFSET;
    /** Stored blocks read ahead: the file's bytes from chunkStart (a new array each time). */
    private byte[] chunk;
    private long chunkStart;

    /** Moves to the next record; false when there is none. */
    boolean next() {
      while (next >= end) {
        if (block + 1 >= blockCount) {
          return false;
        }
        block++;
        BlockCache.Entry cached = slots.get(block);
        if (cached != null) {
          bytes = cached.bytes;
        } else {
          byte[] src = readAhead(block);
          bytes = decodeOrReread(block, src, (int) (offset[block] - chunkStart)).bytes;
        }
        next = Platform.BYTE_ARRAY_OFFSET;
        end = next + rawLength[block];
      }
      at = next;
      next += RECORD_HEADER + Platform.getInt(bytes, at + 8) + Math.max(Platform.getInt(bytes, at + 12), 0);
      return true;
    }

    /** The chunk holding block b, reading up to {@link #READ_AHEAD} bytes of blocks from b when it is not there. */
    private byte[] readAhead(int b) {
      if (chunk == null || offset[b] < chunkStart || offset[b + 1] > chunkStart + chunk.length) {
        int last = b;
        while (last + 1 < blockCount && offset[last + 2] - offset[b] <= READ_AHEAD) {
          last++;
        }
        chunk = read(offset[b], offset[last + 1]);
        chunkStart = offset[b];
        source.blocksRead();
      }
      return chunk;
    }

    int keyGroup() {
      return Platform.getInt(bytes, at);
    }

    int hash() {
      return Platform.getInt(bytes, at + 4);
    }

    long sortKey() {
      return RowImage.sortKey(keyGroup(), hash());
    }

    /** The record is a tombstone: the key is deleted. */
    boolean deleted() {
      return Platform.getInt(bytes, at + 12) < 0;
    }

    UnsafeRow key() {
      UnsafeRow row = new UnsafeRow(keyFields);
      row.pointTo(bytes, at + RECORD_HEADER, Platform.getInt(bytes, at + 8));
      return row;
    }

    /** The value, or null for a tombstone. */
    UnsafeRow value() {
      int valueLength = Platform.getInt(bytes, at + 12);
      if (valueLength < 0) {
        return null;
      }
      UnsafeRow row = new UnsafeRow(valueFields);
      row.pointTo(bytes, at + RECORD_HEADER + Platform.getInt(bytes, at + 8), valueLength);
      return row;
    }
  }

  /** Drops the image's blocks from the cache and closes its source; rows handed out stay valid. */
  @Override
  public void close() throws IOException {
    closed = true;
    pendingFilter = null;
    cache.removeAll(this);
    source.close();
  }

  /** Where the image's bytes come from. */
  BlockSource source() {
    return source;
  }

  /** How messages name the image. */
  String name() {
    return name;
  }

  // ------------------------------------------------------------------ blocks

  /** The first block whose last sort key is >= s (blockCount if none); its index page is read if it was not. */
  private int firstBlockEndingAtOrAfter(long s) {
    int lo = 0;
    int hi = blockCount;
    Pages p = pages;
    if (p != null) {   // the page holding it is the first whose last block ends at or after s
      int q = p.pageEndingAtOrAfter(s);
      if (q == p.count) {
        return blockCount;
      }
      if (p.loaded.get(q) == 0) {
        if (s < p.first[q]) {   // between two pages: the page's first block, whose first key (the directory's) ends the search
          return q * p.perPage;
        }
        readPageAndGuess(p, q, s);
      }
      lo = q * p.perPage;
      hi = Math.min(lo + p.perPage, blockCount);
    }
    return firstAtLeast(lastKey, lo, hi, s);
  }

  /** The first i in [lo, hi) with {@code sorted[i] >= s} ({@code hi} if none). */
  private static int firstAtLeast(long[] sorted, int lo, int hi, long s) {
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (sorted[mid] < s) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  /** The last restart whose record sorts before s (0 if none does). */
  private static int lastRestartBefore(long[] restartKeys, long s) {
    int lo = 0;
    int hi = restartKeys.length - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) >>> 1;
      if (restartKeys[mid] < s) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }

  private BlockCache.Entry block(int b) {
    BlockCache.Entry e = BlockCache.lookup(slots, b);
    return e != null ? e : cache.insert(load(b));
  }

  /** Reads a block alone, for a lookup. */
  private BlockCache.Entry load(int b) {
    entry(b);
    byte[] bytes = read(offset[b], offset[b + 1]);
    source.blocksRead();
    return decodeOrReread(b, bytes, 0);
  }

  // ------------------------------------------------------------------ index pages (a remote version-3 image)

  /** Block b's first sort key: from the directory when b starts a page not read yet, else from its entry. */
  private long firstKeyOf(int b) {
    Pages p = pages;
    if (p != null && p.loaded.get(b / p.perPage) == 0) {
      if (b % p.perPage == 0) {
        return p.first[b / p.perPage];
      }
      readPage(p, b / p.perPage);
    }
    return firstKey[b];
  }

  /** Makes block b's index entry readable (its page read if it was not). */
  private void entry(int b) {
    Pages p = pages;
    if (p != null) {
      readPage(p, b / p.perPage);
    }
  }

  /**
   * Reads index page q (its bytes fetched outside any lock), checks it against its CRC, reading it once more
   * from the checkpoint if it fails (a damaged local copy), and against its directory entry, then publishes it.
   */
  private void readPage(Pages p, int q) {
    if (p.loaded.get(q) != 0) {
      return;
    }
    int b0 = q * p.perPage;
    int b1 = Math.min(b0 + p.perPage, blockCount);
    long at = indexOffset + (long) b0 * INDEX_ENTRY_BYTES;
    int n = (b1 - b0) * INDEX_ENTRY_BYTES;
    try {   // as a prefetch: a lookup's read would point the background fill at the index, not the blocks
      source.prefetch(new long[] {at}, new long[] {at + n});
    } catch (IOException e) {
      throw RowImageException.unfetched(name, e);
    }
    byte[] bytes = read(at, at + n);
    if (crc32(bytes) != p.crc[q]) {
      try {
        bytes = source.reread(at, n);
      } catch (IOException e) {
        throw RowImageException.unreadable(name, e);
      }
      if (bytes == null || crc32(bytes) != p.crc[q]) {
        throw RowImageException.corrupt(name, "index page " + q + " of " + p.count + " fails its CRC-32");
      }
    }
    synchronized (p) {
      if (p.loaded.get(q) != 0) {
        return;
      }
      long n0 = readEntries(ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN), b0, b1, p.start[q],
          q + 1 < p.count ? p.start[q + 1] : indexOffset);
      if (n0 != p.records[q] || firstKey[b0] != p.first[q] || lastKey[b1 - 1] != p.last[q]) {
        throw RowImageException.corrupt(name, "index page " + q + " of " + p.count + " does not match its entry in "
            + "the page directory");
      }
      p.loaded.set(q, 1);   // publishes the page's entries to lookups that read the flag
      if (--p.missing == 0) {
        pages = null;
      }
    }
  }

  /**
   * Reads index page q for a lookup of sort key s, fetching with it, in the same request, the bytes where the
   * key's block most likely is: sort keys are hashes, spread evenly over a page's blocks, so the key's place
   * between the page's first and last sort keys is about its block's place between the page's first byte and
   * its last ({@link #GUESS_BYTES} either side). A restore's first lookup then costs one round trip, not two; a
   * guess that misses costs the block's own fetch, as without it.
   */
  private void readPageAndGuess(Pages p, int q, long s) {
    long pageFrom = indexOffset + (long) q * p.perPage * INDEX_ENTRY_BYTES;
    long pageTo = indexOffset + (long) Math.min((q + 1) * p.perPage, blockCount) * INDEX_ENTRY_BYTES;
    long lo = p.start[q];
    long hi = q + 1 < p.count ? p.start[q + 1] : indexOffset;
    double at = p.last[q] > p.first[q] ? (double) (s - p.first[q]) / (double) (p.last[q] - p.first[q]) : 0;
    long guess = lo + (long) (Math.min(1, Math.max(0, at)) * (hi - lo));
    long from = Math.max(lo, guess - GUESS_BYTES);
    long to = Math.min(hi, guess + GUESS_BYTES);
    try {
      source.prefetch(new long[] {from, pageFrom}, new long[] {Math.max(from + 1, to), pageTo});
    } catch (IOException e) {
      throw RowImageException.unfetched(name, e);
    }
    readPage(p, q);
  }

  /** Reads the index pages these sorted keys need (their bytes in one request), ahead of their lookups. */
  private void readPagesOf(long[] sorted, int m) {
    Pages p = pages;
    if (p == null) {
      return;
    }
    int[] wanted = new int[Math.min(m, p.count)];
    int w = 0;
    for (int i = 0; i < m && w < wanted.length; i++) {
      int q = p.pageEndingAtOrAfter(sorted[i]);
      if (q < p.count && p.loaded.get(q) == 0 && (w == 0 || wanted[w - 1] != q)) {
        wanted[w++] = q;
      }
    }
    readPages(p, Arrays.copyOf(wanted, w));
  }

  /** Reads every index page not read yet (a cursor; the key filter's check): their bytes in one request. */
  private void readAllPages() {
    Pages p = pages;
    if (p == null) {
      return;
    }
    int[] all = new int[p.count];
    int w = 0;
    for (int q = 0; q < p.count; q++) {
      if (p.loaded.get(q) == 0) {
        all[w++] = q;
      }
    }
    readPages(p, Arrays.copyOf(all, w));
  }

  /** Pages {@code qs} (ascending): fetched at once, then each read from the local copy. */
  private void readPages(Pages p, int[] qs) {
    if (qs.length == 0) {
      return;
    }
    if (qs.length > 1) {
      long[] from = new long[qs.length];
      long[] to = new long[qs.length];
      int r = 0;
      for (int q : qs) {
        long a = indexOffset + (long) q * p.perPage * INDEX_ENTRY_BYTES;
        long z = indexOffset + (long) Math.min((q + 1) * p.perPage, blockCount) * INDEX_ENTRY_BYTES;
        if (r > 0 && to[r - 1] == a) {
          to[r - 1] = z;
        } else {
          from[r] = a;
          to[r++] = z;
        }
      }
      try {
        source.prefetch(Arrays.copyOf(from, r), Arrays.copyOf(to, r));
      } catch (IOException e) {
        throw RowImageException.unfetched(name, e);
      }
    }
    for (int q : qs) {
      readPage(p, q);
    }
  }

  /**
   * The page directory of a remote version-3 image while some index pages are not read (file layout: the
   * module docstring of spark_state/format/rowimage.py): per page of {@code perPage} consecutive index entries,
   * its first and last sort keys, its first block's offset, its CRC-32 and its records, checked at open (the
   * directory's CRC, order, offsets, record total); and which pages the index arrays hold.
   */
  private final class Pages {
    final int count;
    final int perPage;
    final long[] first;
    final long[] last;
    final long[] start;
    final int[] crc;
    final long[] records;
    /** 1: the page's entries are in the index arrays (a volatile write after them). */
    final AtomicIntegerArray loaded;
    /** Pages not read yet (guarded by this). */
    int missing;

    Pages(byte[] directory, int count, int perPage, int directoryCrc) {
      CRC32 c = new CRC32();
      c.update(directory);
      c.update(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putInt(count).putInt(perPage).array());
      if ((int) c.getValue() != directoryCrc) {
        throw RowImageException.corrupt(name, "the page directory fails its CRC-32");
      }
      this.count = count;
      this.perPage = perPage;
      this.first = new long[count];
      this.last = new long[count];
      this.start = new long[count];
      this.crc = new int[count];
      this.records = new long[count];
      ByteBuffer d = ByteBuffer.wrap(directory).order(ByteOrder.LITTLE_ENDIAN);
      long total = 0;
      for (int q = 0; q < count; q++) {
        int at = q * PAGE_ENTRY_BYTES;
        first[q] = d.getLong(at);
        last[q] = d.getLong(at + 8);
        start[q] = d.getLong(at + 16);
        crc[q] = d.getInt(at + 24);
        records[q] = d.getInt(at + 28) & 0xFFFFFFFFL;
        int entries = Math.min(perPage, blockCount - q * perPage);
        if (first[q] < 0 || last[q] < first[q] || (q > 0 && first[q] < last[q - 1])
            || (q == 0 ? start[q] != 0 : start[q] <= start[q - 1]) || start[q] >= indexOffset
            || records[q] < entries) {
          throw RowImageException.corrupt(name, "page directory entry " + q + " of " + count + " is out of order");
        }
        total += records[q];
        offset[q * perPage] = start[q];
      }
      if (total != RowImage.this.records) {
        throw RowImageException.corrupt(name, "the trailer counts " + RowImage.this.records + " records, the page "
            + "directory " + total);
      }
      offset[blockCount] = indexOffset;
      this.loaded = new AtomicIntegerArray(count);
      this.missing = count;
    }

    /** The first page whose last block ends at or after sort key s ({@link #count} if none). */
    int pageEndingAtOrAfter(long s) {
      return firstAtLeast(last, 0, count, s);
    }
  }

  /** The file's bytes [from, to): a new array (blocks and rows may point into it). */
  private byte[] read(long from, long to) {
    if (closed) {
      throw new IllegalStateException("spark_state: the row image " + name + " is closed");
    }
    try {
      return readAt(from, (int) (to - from));
    } catch (IOException e) {
      throw RowImageException.unreadable(name, e);
    }
  }

  /**
   * {@link #decode}, and for a block that fails a check where the source holds a copy (a remote image's
   * local cache), the block read again from the checkpoint and decoded once more: only the checkpoint's
   * own bytes can make it corrupt.
   */
  private BlockCache.Entry decodeOrReread(int b, byte[] src, int from) {
    try {
      return decode(b, src, from);
    } catch (RowImageException e) {
      byte[] again;
      try {
        again = source.reread(offset[b], (int) (offset[b + 1] - offset[b]));
      } catch (IOException io) {
        e.addSuppressed(io);
        throw e;
      }
      if (again == null) {
        throw e;
      }
      return decode(b, again, 0);
    }
  }

  /**
   * Block b from its stored bytes at {@code src[from..]}: verified (when asked), decompressed into an
   * array of its own, its records checked and indexed.
   */
  private BlockCache.Entry decode(int b, byte[] src, int from) {
    int stored = (int) (offset[b + 1] - offset[b]);
    if (verifyChecksums && crc32(src, from, stored) != crc[b]) {
      throw RowImageException.corrupt(name, b, blockCount, "CRC-32 mismatch (ChecksumMismatch)");
    }
    byte[] raw;
    if (codec == CODEC_ZSTD) {
      raw = decompress(b, src, from, stored);
    } else {
      raw = from == 0 && src.length == stored ? src : Arrays.copyOfRange(src, from, from + stored);
    }
    return indexBlock(b, raw);
  }

  private byte[] decompress(int b, byte[] src, int from, int length) {
    byte[] raw = new byte[rawLength[b]];
    ZstdDecompressCtx ctx = Decompressors.take();
    int n;
    try {
      n = ctx.decompressByteArray(raw, 0, raw.length, src, from, length);
    } catch (ZstdException e) {
      ctx.close();
      throw RowImageException.corrupt(name, b, blockCount, "zstd: " + e.getMessage());
    }
    Decompressors.give(ctx);
    if (n != raw.length) {
      throw RowImageException.corrupt(name, b, blockCount, "decompressed to " + n + " bytes, not " + raw.length);
    }
    return raw;
  }

  /**
   * Checks that the records tile the block exactly, in order, within the block's sort-key range, and
   * notes every {@link #RESTART_INTERVAL}-th record's offset and sort key for lookups.
   */
  private BlockCache.Entry indexBlock(int b, byte[] bytes) {
    long at = Platform.BYTE_ARRAY_OFFSET;
    long end = at + bytes.length;
    long previous = firstKey[b];
    int n = 0;
    int[] restarts = new int[(blockRecords[b] + RESTART_INTERVAL - 1) / RESTART_INTERVAL];
    long[] restartKeys = new long[restarts.length];
    while (at < end) {
      String bad = null;
      long k = 0;
      if (end - at < RECORD_HEADER) {
        bad = "a record header past the block's end";
      } else {
        int keyGroup = Platform.getInt(bytes, at);
        k = sortKey(keyGroup, Platform.getInt(bytes, at + 4));
        int keyLength = Platform.getInt(bytes, at + 8);
        int valueLength = Platform.getInt(bytes, at + 12);
        long length = RECORD_HEADER + (long) keyLength + Math.max(valueLength, 0);
        if (keyGroup < 0 || k < previous || k > lastKey[b] || (n == 0 && k != firstKey[b])) {
          bad = "record " + n + " is out of order";
        } else if (keyLength < 0 || keyLength % 8 != 0 || valueLength < -1 || (valueLength > 0 && valueLength % 8 != 0)
            || (valueLength == -1 && !tombstones) || length > end - at) {
          bad = "record " + n + " has lengths " + keyLength + "/" + valueLength;
        } else if (n % RESTART_INTERVAL == 0 && n / RESTART_INTERVAL < restarts.length) {
          restarts[n / RESTART_INTERVAL] = (int) (at - Platform.BYTE_ARRAY_OFFSET);
          restartKeys[n / RESTART_INTERVAL] = k;
        }
        at += length;
      }
      if (bad != null) {
        throw RowImageException.corrupt(name, b, blockCount, bad);
      }
      previous = k;
      n++;
    }
    if (n != blockRecords[b] || previous != lastKey[b]) {
      throw RowImageException.corrupt(name, b, blockCount, n + " records ending at sort key " + previous
          + ", the index says " + blockRecords[b] + " ending at " + lastKey[b]);
    }
    return new BlockCache.Entry(this, b, bytes, restarts, restartKeys);
  }

  private byte[] readAt(long position, int length) throws IOException {
    try {
      return source.read(position, length);
    } catch (EOFException e) {
      throw RowImageException.corrupt(name, "truncated: " + length + " bytes at " + position + " are past its end");
    }
  }

  static int crc32(byte[] bytes) {
    return crc32(bytes, 0, bytes.length);
  }

  static int crc32(byte[] bytes, int from, int length) {
    CRC32 c = new CRC32();
    c.update(bytes, from, length);
    return (int) c.getValue();
  }

  /**
   * Reusable zstd decompression contexts: creating one per block costs more than decompressing a small
   * block, and a context per thread would leak its native memory when the thread ends.
   */
  private static final class Decompressors {
    private static final int MAX_IDLE = 16;
    private static final ArrayDeque<ZstdDecompressCtx> IDLE = new ArrayDeque<>();

    static ZstdDecompressCtx take() {
      synchronized (IDLE) {
        ZstdDecompressCtx ctx = IDLE.poll();
        if (ctx != null) {
          return ctx;
        }
      }
      return new ZstdDecompressCtx();
    }

    static void give(ZstdDecompressCtx ctx) {
      synchronized (IDLE) {
        if (IDLE.size() < MAX_IDLE) {
          IDLE.push(ctx);
          return;
        }
      }
      ctx.close();
    }
  }
}
