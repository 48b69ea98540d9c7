package io.sparkstate.shim.engine;

import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.Closeable;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.zip.CRC32;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdCompressCtx;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.unsafe.Platform;

/**
 * Writes a row image (see {@link RowImage}) from records given in sort order, streaming: it holds one
 * block of records and the index (40 bytes a block, a fraction of a byte a row), never the rows. The
 * JVM writes spill runs with it: local files, a cache of state that lives elsewhere, so nothing is
 * fsynced. {@link #finish} completes the file; closing an unfinished writer deletes it.
 */
final class RowImageWriter implements Closeable {
  /** The format version of spill runs: no page directory (read whole, from a local disk). */
  static final int VERSION = 2;
  static final int DEFAULT_BLOCK_BYTES = 4 << 10;
  static final int ZSTD_LEVEL = 1;

  private final Path path;
  private final int blockBytes;
  private final int codec;
  private final OutputStream out;
  private final ZstdCompressCtx zstd;
  private final ByteArrayOutputStream index = new ByteArrayOutputStream();
  private final CRC32 crc = new CRC32();
  private final ByteBuffer entry = ByteBuffer.allocate(RowImage.INDEX_ENTRY_BYTES).order(ByteOrder.LITTLE_ENDIAN);
  private byte[] block;
  private byte[] compressed = new byte[0];
  private int used;
  private int blockRecords;
  private long blockFirst;
  private long last = -1;
  private long records;
  private long written;
  private int blocks;
  private boolean tombstones;
  private boolean finished;
  private boolean closed;
  /** The file's key filter (null: written without one). */
  private final KeyFilter filter;

  /** {@code compress}: zstd blocks (codec 1), else raw ones (codec 0); no key filter. Replaces an existing file. */
  RowImageWriter(Path path, int blockBytes, boolean compress) throws IOException {
    this(path, blockBytes, compress, -1);
  }

  /**
   * A writer of about {@code expectedRecords} records (more is allowed, with more false positives), with a
   * key filter sized for them (negative: none). Replaces an existing file.
   */
  RowImageWriter(Path path, int blockBytes, boolean compress, long expectedRecords) throws IOException {
    RowImage.checkByteOrder();
    if (blockBytes < RowImage.RECORD_HEADER) {
      throw new IllegalArgumentException("spark_state: row image blocks of " + blockBytes + " bytes");
    }
    this.path = path;
    this.blockBytes = blockBytes;
    this.codec = compress ? RowImage.CODEC_ZSTD : RowImage.CODEC_RAW;
    this.block = new byte[blockBytes];
    this.filter = expectedRecords < 0 ? null : KeyFilter.forRecords(expectedRecords);
    this.zstd = compress ? new ZstdCompressCtx().setLevel(ZSTD_LEVEL) : null;
    try {
      this.out = new BufferedOutputStream(Files.newOutputStream(path, StandardOpenOption.CREATE,
          StandardOpenOption.TRUNCATE_EXISTING, StandardOpenOption.WRITE), 1 << 16);
    } catch (IOException | RuntimeException e) {
      if (zstd != null) {
        zstd.close();
      }
      throw e;
    }
  }

  /**
   * Appends a record; records come in ascending sort key ({@link RowImage#sortKey}), a key at most once.
   * A null {@code value} is a tombstone (the key is deleted).
   */
  void add(int keyGroup, int hash, UnsafeRow key, UnsafeRow value) throws IOException {
    if (finished || closed) {
      throw new IllegalStateException("spark_state: the row image writer of " + path + " is finished");
    }
    long k = RowImage.sortKey(keyGroup, hash);
    if (keyGroup < 0 || k < last) {
      throw new IllegalArgumentException("spark_state: row image records out of order: key group " + keyGroup
          + ", hash " + hash + " after sort key " + last);
    }
    int keyLength = key.getSizeInBytes();
    int valueLength = value == null ? -1 : value.getSizeInBytes();
    if (keyLength % 8 != 0 || Math.max(valueLength, 0) % 8 != 0) {
      throw new IllegalArgumentException("spark_state: rows of " + keyLength + " and " + valueLength
          + " bytes are not UnsafeRows");
    }
    long length = RowImage.RECORD_HEADER + (long) keyLength + Math.max(valueLength, 0);
    if (length > RowImage.MAX_BLOCK) {
      throw new IllegalArgumentException("spark_state: a row of " + length + " bytes");
    }
    if (used > 0 && used + length > blockBytes) {
      flushBlock();
    }
    if (used + length > block.length) {
      block = Arrays.copyOf(block, (int) (used + length));
    }
    if (used == 0) {
      blockFirst = k;
    }
    long at = Platform.BYTE_ARRAY_OFFSET + used;
    Platform.putInt(block, at, keyGroup);
    Platform.putInt(block, at + 4, hash);
    Platform.putInt(block, at + 8, keyLength);
    Platform.putInt(block, at + 12, valueLength);
    Platform.copyMemory(key.getBaseObject(), key.getBaseOffset(), block, at + RowImage.RECORD_HEADER, keyLength);
    if (value != null) {
      Platform.copyMemory(value.getBaseObject(), value.getBaseOffset(), block,
          at + RowImage.RECORD_HEADER + keyLength, valueLength);
    } else {
      tombstones = true;
    }
    if (filter != null) {
      filter.add(hash);
    }
    used += (int) length;
    blockRecords++;
    records++;
    last = k;
  }

  /**
   * Appends the first {@code n} records of these arrays in sort order, whatever their order here (a
   * stable sort of their positions: the rows are not copied). Null values are tombstones.
   */
  void addUnsorted(int n, int[] keyGroups, int[] hashes, UnsafeRow[] keys, UnsafeRow[] values) throws IOException {
    long[] sortKeys = new long[n];
    for (int i = 0; i < n; i++) {
      sortKeys[i] = RowImage.sortKey(keyGroups[i], hashes[i]);
    }
    for (int i : sortedPositions(sortKeys)) {
      add(keyGroups[i], hashes[i], keys[i], values[i]);
    }
  }

  /** Positions 0..n-1 ordered by their sort keys (bottom-up merge sort: stable, no boxing). */
  static int[] sortedPositions(long[] sortKeys) {
    int n = sortKeys.length;
    int[] a = new int[n];
    int[] b = new int[n];
    for (int i = 0; i < n; i++) {
      a[i] = i;
    }
    for (int width = 1; width < n; width *= 2) {
      for (int lo = 0; lo < n; lo += 2 * width) {
        int mid = Math.min(lo + width, n);
        int hi = Math.min(lo + 2 * width, n);
        int i = lo;
        int j = mid;
        for (int k = lo; k < hi; k++) {
          b[k] = i < mid && (j >= hi || sortKeys[a[i]] <= sortKeys[a[j]]) ? a[i++] : a[j++];
        }
      }
      int[] t = a;
      a = b;
      b = t;
    }
    return a;
  }

  long records() {
    return records;
  }

  /** Writes the last block, the index and the trailer and closes the file; returns its size in bytes. */
  long finish() throws IOException {
    if (finished || closed) {
      throw new IllegalStateException("spark_state: the row image writer of " + path + " is finished");
    }
    if (used > 0) {
      flushBlock();
    }
    byte[] indexBytes = index.toByteArray();
    out.write(indexBytes);
    long indexOffset = written;
    written += indexBytes.length;
    int flags = tombstones ? RowImage.FLAG_TOMBSTONES : 0;
    if (filter != null) {
      long[] words = filter.words();
      ByteBuffer bits = ByteBuffer.allocate(8 * words.length).order(ByteOrder.LITTLE_ENDIAN);
      bits.asLongBuffer().put(words);
      byte[] bytes = bits.array();
      out.write(bytes);
      ByteBuffer header = ByteBuffer.allocate(KeyFilter.HEADER_BYTES).order(ByteOrder.LITTLE_ENDIAN);
      header.putInt(words.length).putInt(filter.hashes()).putInt(RowImage.crc32(bytes)).putInt(0);
      out.write(header.array());
      written += bytes.length + KeyFilter.HEADER_BYTES;
      flags |= RowImage.FLAG_FILTER;
    }
    ByteBuffer trailer = ByteBuffer.allocate(RowImage.TRAILER_BYTES).order(ByteOrder.LITTLE_ENDIAN);
    trailer.putLong(indexOffset).putLong(records).putInt(blocks).putInt(RowImage.crc32(indexBytes)).putInt(codec)
        .putInt(flags).put(RowImage.MAGIC).put((byte) VERSION);
    out.write(trailer.array());
    written += RowImage.TRAILER_BYTES;
    finished = true;
    close();
    return written;
  }

  /** Releases the writer; a file not {@link #finish}ed is deleted. */
  @Override
  public void close() throws IOException {
    if (closed) {
      return;
    }
    closed = true;
    try {
      if (zstd != null) {
        zstd.close();
      }
      out.close();
    } finally {
      if (!finished) {
        Files.deleteIfExists(path);
      }
    }
  }

  private void flushBlock() throws IOException {
    byte[] stored = block;
    int storedLength = used;
    if (zstd != null) {
      int bound = (int) Math.min(RowImage.MAX_BLOCK, Zstd.compressBound(used));
      if (compressed.length < bound) {
        compressed = new byte[Math.max(bound, (int) Zstd.compressBound(blockBytes))];
      }
      storedLength = zstd.compressByteArray(compressed, 0, compressed.length, block, 0, used);
      stored = compressed;
    }
    crc.reset();
    crc.update(stored, 0, storedLength);
    out.write(stored, 0, storedLength);
    entry.clear();
    entry.putLong(blockFirst).putLong(last).putLong(written).putInt(storedLength).putInt(used)
        .putInt((int) crc.getValue()).putInt(blockRecords);
    index.write(entry.array(), 0, RowImage.INDEX_ENTRY_BYTES);
    written += storedLength;
    blocks++;
    used = 0;
    blockRecords = 0;
    if (block.length > blockBytes) {
      block = new byte[blockBytes];   // a record larger than a block had its own: do not keep its array
    }
  }
}
