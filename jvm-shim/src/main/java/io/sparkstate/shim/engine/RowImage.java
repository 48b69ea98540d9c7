package io.sparkstate.shim.engine;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicReferenceArray;
import java.util.zip.CRC32;

import com.github.luben.zstd.ZstdDecompressCtx;
import com.github.luben.zstd.ZstdException;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.array.ByteArrayMethods;

/**
 * A row image opened for lookups: a local state file of UnsafeRow records sorted by (key group, hash)
 * in small blocks (layout: issue 23's row image spec, "File layout"). Only the block index is on
 * the heap (a few bytes per block); blocks are read on demand, verified and decompressed into the
 * executor's {@link BlockCache}, and rows point straight into them. Nothing is memory-mapped, so what
 * the image keeps resident is the index plus its share of the cache.
 *
 * <p>The file is read with {@link RandomAccessFile} under a lock rather than a {@code FileChannel}: a
 * thread interrupted in a channel read closes the channel for every thread (Spark interrupts the
 * tasks of a stopped query), while a plain read ignores interrupts. A lookup holds the lock only on
 * a cache miss, for one block's bytes; a cursor for up to {@link #READ_AHEAD} bytes.
 *
 * <p>Thread-safe. Every structural fact about a block is checked once, when it is loaded (lengths,
 * order, record count), so lookups read the block with unchecked accesses that stay in bounds; a
 * failed check is a {@link RowImageException} naming the file and the block.
 */
final class RowImage implements Closeable {
  static final byte[] MAGIC = "SPKSTRI".getBytes(StandardCharsets.US_ASCII);
  /** The version this code writes and the newest it reads (1: no filter; 2: a key filter may follow the index). */
  static final int VERSION = 2;
  static final int TRAILER_BYTES = 40;
  static final int INDEX_ENTRY_BYTES = 40;
  static final int RECORD_HEADER = 16;
  static final int CODEC_RAW = 0;
  static final int CODEC_ZSTD = 1;
  static final int FLAG_TOMBSTONES = 1;
  static final int FLAG_FILTER = 2;
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
  private final RandomAccessFile file;
  private final BlockCache cache;
  private final boolean verifyChecksums;
  private final int keyFields;
  private final int valueFields;
  private final long records;
  private final int codec;
  private final boolean tombstones;
  /** The file's key filter, or null (a version-1 file, or one written without). */
  private final KeyFilter filter;
  private final int blockCount;
  private final long[] firstKey;
  private final long[] lastKey;
  /** Where each block starts; one more entry: where the index starts (blocks follow each other). */
  private final long[] offset;
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
    RandomAccessFile file = new RandomAccessFile(path.toFile(), "r");
    try {
      return new RowImage(path, file, keyFields, valueFields, cache, verifyChecksums);
    } catch (RuntimeException | IOException e) {
      file.close();
      throw e;
    }
  }

  private RowImage(Path path, RandomAccessFile file, int keyFields, int valueFields, BlockCache cache,
      boolean verifyChecksums) throws IOException {
    this.path = path;
    this.file = file;
    this.keyFields = keyFields;
    this.valueFields = valueFields;
    this.cache = cache;
    this.verifyChecksums = verifyChecksums;
    long size = file.length();
    if (size < TRAILER_BYTES) {
      throw RowImageException.corrupt(path, "truncated: " + size + " bytes, less than its " + TRAILER_BYTES
          + "-byte trailer");
    }
    ByteBuffer trailer = ByteBuffer.wrap(readAt(size - TRAILER_BYTES, TRAILER_BYTES)).order(ByteOrder.LITTLE_ENDIAN);
    for (int i = 0; i < MAGIC.length; i++) {
      if (trailer.get(32 + i) != MAGIC[i]) {
        throw RowImageException.corrupt(path, "no row image trailer (truncated, or not a row image)");
      }
    }
    int version = trailer.get(39) & 0xFF;
    if (version > VERSION) {
      throw RowImageException.newer(path, "row image format version " + version + ", this one reads " + VERSION);
    }
    if (version < 1) {
      throw RowImageException.corrupt(path, "row image format version " + version);
    }
    long indexOffset = trailer.getLong(0);
    this.records = trailer.getLong(8);
    long blocks = trailer.getInt(16) & 0xFFFFFFFFL;
    int indexCrc = trailer.getInt(20);
    this.codec = trailer.getInt(24);
    int flags = trailer.getInt(28);
    if (codec != CODEC_RAW && codec != CODEC_ZSTD) {
      throw RowImageException.newer(path, "block codec " + codec);
    }
    int known = version >= 2 ? FLAG_TOMBSTONES | FLAG_FILTER : FLAG_TOMBSTONES;
    if ((flags & ~known) != 0) {
      throw RowImageException.newer(path, "flags 0x" + Integer.toHexString(flags));
    }
    this.tombstones = (flags & FLAG_TOMBSTONES) != 0;
    long filterBytes = 0;
    int filterWords = 0;
    int filterHashes = 0;
    int filterCrc = 0;
    if ((flags & FLAG_FILTER) != 0) {
      if (size < TRAILER_BYTES + KeyFilter.HEADER_BYTES) {
        throw RowImageException.corrupt(path, "truncated: no room for its filter header");
      }
      ByteBuffer header = ByteBuffer.wrap(readAt(size - TRAILER_BYTES - KeyFilter.HEADER_BYTES, KeyFilter.HEADER_BYTES))
          .order(ByteOrder.LITTLE_ENDIAN);
      filterWords = header.getInt(0);
      filterHashes = header.getInt(4);
      filterCrc = header.getInt(8);
      if (filterWords <= 0 || filterWords > (Integer.MAX_VALUE >> 3) || filterHashes < 1 || filterHashes > 30) {
        throw RowImageException.corrupt(path, "a filter header of " + filterWords + " words and " + filterHashes
            + " hashes");
      }
      filterBytes = 8L * filterWords + KeyFilter.HEADER_BYTES;
    }
    if (indexOffset < 0 || blocks * INDEX_ENTRY_BYTES + filterBytes + TRAILER_BYTES != size - indexOffset) {
      throw RowImageException.corrupt(path, "truncated or damaged: the trailer puts " + blocks + " index entries at "
          + indexOffset + " in a file of " + size + " bytes");
    }
    this.blockCount = (int) blocks;
    byte[] indexBytes = readAt(indexOffset, blockCount * INDEX_ENTRY_BYTES);
    if (crc32(indexBytes) != indexCrc) {
      throw RowImageException.corrupt(path, "the block index fails its CRC-32");
    }
    this.firstKey = new long[blockCount];
    this.lastKey = new long[blockCount];
    this.offset = new long[blockCount + 1];
    this.rawLength = new int[blockCount];
    this.crc = new int[blockCount];
    this.blockRecords = new int[blockCount];
    readIndex(ByteBuffer.wrap(indexBytes).order(ByteOrder.LITTLE_ENDIAN), indexOffset);
    this.slots = new AtomicReferenceArray<>(blockCount);
    if (filterWords > 0) {
      byte[] words = readAt(indexOffset + (long) blockCount * INDEX_ENTRY_BYTES, 8 * filterWords);
      if (crc32(words) != filterCrc) {
        throw RowImageException.corrupt(path, "the key filter fails its CRC-32");
      }
      long[] bits = new long[filterWords];
      ByteBuffer.wrap(words).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().get(bits);
      this.filter = new KeyFilter(bits, filterHashes);
      // the CRC covers the words, not k: a filter must at least let through each block's first and last
      // record, whose hashes the (checked) index holds
      for (int b = 0; b < blockCount; b++) {
        if (!filter.mightContain((int) firstKey[b]) || !filter.mightContain((int) lastKey[b])) {
          throw RowImageException.corrupt(path, "the key filter rules out a key of block " + b + " (its header "
              + "is damaged)");
        }
      }
    } else {
      this.filter = null;
    }
  }

  private void readIndex(ByteBuffer index, long indexOffset) {
    long total = 0;
    for (int b = 0; b < blockCount; b++) {
      int at = b * INDEX_ENTRY_BYTES;
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
      } else if (firstKey[b] < 0 || lastKey[b] < firstKey[b] || (b > 0 && firstKey[b] < lastKey[b - 1])) {
        bad = "sort keys out of order";
      }
      if (bad != null) {
        throw RowImageException.corrupt(path, b, blockCount, "index entry: " + bad);
      }
      offset[b + 1] = start + stored;
      rawLength[b] = (int) raw;
      blockRecords[b] = (int) n;
      total += n;
    }
    if (offset[blockCount] != indexOffset) {
      throw RowImageException.corrupt(path, "the blocks end at " + offset[blockCount] + ", the index starts at "
          + indexOffset);
    }
    if (total != records) {
      throw RowImageException.corrupt(path, "the trailer counts " + records + " records, the index " + total);
    }
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

  /** Heap the open image keeps outside the block cache: the index, the cache slots and the filter. */
  long heapBytes() {
    return 6L * 16 + 8L * (3L * blockCount + 1) + 4L * 4 * blockCount + (filter == null ? 0 : filter.bytes());
  }

  /** Whether the file has a key filter (a version-1 file has none). */
  boolean hasFilter() {
    return filter != null;
  }

  /** False only if the file holds no record of this hash (always true without a filter). */
  boolean mightContain(int hash) {
    return filter == null || filter.mightContain(hash);
  }

  /**
   * The value of {@code key} (hash {@code hash}, key group {@code keyGroup}): a row pointing into a
   * cached block (its bytes never change), {@link #DELETED} if this image holds the key as deleted,
   * or null if it does not hold the key. A key the filter rules out costs no block.
   */
  UnsafeRow get(int keyGroup, int hash, UnsafeRow key) {
    if (filter != null && !filter.mightContain(hash)) {
      return null;
    }
    long s = sortKey(keyGroup, hash);
    int n = key.getSizeInBytes();
    Object keyBase = key.getBaseObject();
    long keyOffset = key.getBaseOffset();
    for (int b = firstBlockEndingAtOrAfter(s); b < blockCount && firstKey[b] <= s; b++) {
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
    if (filter != null && !filter.mightContain(hash)) {
      return;
    }
    long s = sortKey(keyGroup, hash);
    for (int b = firstBlockEndingAtOrAfter(s); b < blockCount && firstKey[b] <= s; b++) {
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
          bytes = decode(block, src, (int) (offset[block] - chunkStart)).bytes;
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

  /** Drops the image's blocks from the cache and closes the file; rows handed out stay valid. */
  @Override
  public void close() throws IOException {
    closed = true;
    cache.removeAll(this);
    synchronized (file) {
      file.close();
    }
  }

  // ------------------------------------------------------------------ blocks

  /** The first block whose last sort key is >= s (blockCount if none). */
  private int firstBlockEndingAtOrAfter(long s) {
    int lo = 0;
    int hi = blockCount;
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (lastKey[mid] < s) {
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
    return decode(b, read(offset[b], offset[b + 1]), 0);
  }

  /** The file's bytes [from, to): a new array (blocks and rows may point into it). */
  private byte[] read(long from, long to) {
    if (closed) {
      throw new IllegalStateException("spark_state: the row image " + path + " is closed");
    }
    try {
      return readAt(from, (int) (to - from));
    } catch (IOException e) {
      throw RowImageException.unreadable(path, e);
    }
  }

  /**
   * Block b from its stored bytes at {@code src[from..]}: verified (when asked), decompressed into an
   * array of its own, its records checked and indexed.
   */
  private BlockCache.Entry decode(int b, byte[] src, int from) {
    int stored = (int) (offset[b + 1] - offset[b]);
    if (verifyChecksums && crc32(src, from, stored) != crc[b]) {
      throw RowImageException.corrupt(path, b, blockCount, "CRC-32 mismatch (ChecksumMismatch)");
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
      throw RowImageException.corrupt(path, b, blockCount, "zstd: " + e.getMessage());
    }
    Decompressors.give(ctx);
    if (n != raw.length) {
      throw RowImageException.corrupt(path, b, blockCount, "decompressed to " + n + " bytes, not " + raw.length);
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
        throw RowImageException.corrupt(path, b, blockCount, bad);
      }
      previous = k;
      n++;
    }
    if (n != blockRecords[b] || previous != lastKey[b]) {
      throw RowImageException.corrupt(path, b, blockCount, n + " records ending at sort key " + previous
          + ", the index says " + blockRecords[b] + " ending at " + lastKey[b]);
    }
    return new BlockCache.Entry(this, b, bytes, restarts, restartKeys);
  }

  private byte[] readAt(long position, int length) throws IOException {
    byte[] dst = new byte[length];
    synchronized (file) {
      file.seek(position);
      try {
        file.readFully(dst);
      } catch (EOFException e) {
        throw RowImageException.corrupt(path, "truncated: " + length + " bytes at " + position + " are past its end");
      }
    }
    return dst;
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
