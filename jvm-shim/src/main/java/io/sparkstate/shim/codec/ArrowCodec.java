package io.sparkstate.shim.codec;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;

import io.sparkstate.shim.memory.MemoryBudget;
import io.sparkstate.shim.memory.Reservation;
import org.apache.arrow.memory.AllocationListener;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.StructType;

/**
 * Arrow IPC streams of docs/protocol.md: {@code kg:int32, hash:int32, key, value} (null value =
 * delete), key and value either typed struct columns ({@link TypedCodec}) or opaque {@code UnsafeRow}
 * bytes (format 1, for schemas Spark's Arrow conversion cannot map, and checkpoints written before
 * typed files). Only encoding and decoding; no storage logic.
 */
public final class ArrowCodec {
  /** Rows per Arrow batch ({@code -Dio.sparkstate.batchRows}: tests cut tiny batches into several batches and chunks). */
  static final int BATCH_ROWS = Math.max(1, Integer.getInteger("io.sparkstate.batchRows", 16384));
  /** A batch's key and value bytes stay well under the 2 GiB its 32-bit binary offsets can address. */
  static final long BATCH_BYTES = 256L << 20;
  /** Arrow memory of encoding whole versions and of decoding loads: the budget's "arrow" reservation. */
  private static final Reservation ARROW = MemoryBudget.executor().reserve("arrow", null);
  private static final BufferAllocator ROOT = new RootAllocator(new AllocationListener() {
    @Override
    public void onAllocation(long size) {
      ARROW.add(size);
    }

    @Override
    public void onRelease(long size) {
      ARROW.add(-size);
    }
  }, Long.MAX_VALUE);

  static final Schema SCHEMA = new Schema(Arrays.asList(
      Field.nullable("kg", new ArrowType.Int(32, true)),
      Field.nullable("hash", new ArrowType.Int(32, true)),
      Field.nullable("key", ArrowType.Binary.INSTANCE),
      Field.nullable("value", ArrowType.Binary.INSTANCE)));

  private ArrowCodec() {}

  /**
   * An encoded request body in segments of at most 64 MiB, sent straight from them (no extra copy):
   * a partition's changes may exceed the 2 GiB of one Java array. The system property
   * {@code spark_state.bodySegmentBytes} makes segments smaller (tests cross many segments with little data).
   */
  public static final class Body extends OutputStream {
    private final int SEGMENT = Math.max(16, Integer.getInteger("spark_state.bodySegmentBytes", 64 << 20));
    private final List<byte[]> full = new ArrayList<>();
    private byte[] current;
    private int used;
    private long size;

    Body(int initial) {
      current = new byte[Math.min(Math.max(16, initial), SEGMENT)];
    }

    @Override
    public void write(int b) {
      write(new byte[] {(byte) b}, 0, 1);
    }

    @Override
    public void write(byte[] b, int off, int len) {
      while (len > 0) {
        if (used == current.length) {
          grow();
        }
        int n = Math.min(len, current.length - used);
        System.arraycopy(b, off, current, used, n);
        used += n;
        off += n;
        len -= n;
        size += n;
      }
    }

    private void grow() {
      if (current.length < SEGMENT) {
        current = Arrays.copyOf(current, (int) Math.min((long) current.length * 2, SEGMENT));
      } else {
        full.add(current);
        current = new byte[SEGMENT];
        used = 0;
      }
    }

    public long size() {
      return size;
    }

    /** A body of the {@code size} bytes {@code in} holds next (a chunk spooled to local disk, sent again). */
    public static Body read(InputStream in, long size) throws IOException {
      Body body = new Body((int) Math.min(size, Integer.MAX_VALUE - 16));
      byte[] buffer = new byte[64 << 10];
      for (long left = size; left > 0; ) {
        int n = in.read(buffer, 0, (int) Math.min(buffer.length, left));
        if (n < 0) {
          throw new java.io.EOFException("spark_state: a spooled chunk ends " + left + " bytes early");
        }
        body.write(buffer, 0, n);
        left -= n;
      }
      return body;
    }

    public void writeTo(OutputStream out) throws IOException {
      for (byte[] segment : full) {
        out.write(segment);
      }
      out.write(current, 0, used);
    }
  }

  /** Encodes rows (null value = delete) as one Arrow stream of opaque rows ({@code expected}: about how many). */
  public static Body encodeOpaque(Iterator<UnsafeRowPair> rows, long expected, KeyHasher hasher) throws IOException {
    Body bytes = new Body((int) Math.max(1024, Math.min(expected, 1 << 22) * 64));
    try (BufferAllocator alloc = ROOT.newChildAllocator("spark-state-commit", 0, Long.MAX_VALUE);
         VectorSchemaRoot root = VectorSchemaRoot.create(SCHEMA, alloc);
         ArrowStreamWriter writer = new ArrowStreamWriter(root, null, bytes)) {
      IntVector kg = (IntVector) root.getVector("kg");
      IntVector hash = (IntVector) root.getVector("hash");
      VarBinaryVector key = (VarBinaryVector) root.getVector("key");
      VarBinaryVector value = (VarBinaryVector) root.getVector("value");
      writer.start();
      int n = 0;
      long batchBytes = 0;
      root.allocateNew();
      while (rows.hasNext()) {
        UnsafeRowPair row = rows.next();
        UnsafeRow k = row.key();
        UnsafeRow v = row.value();
        int h = hasher.hash(k);
        kg.setSafe(n, hasher.keyGroup(h));
        hash.setSafe(n, h);
        key.setSafe(n, k.getBytes());
        if (v == null) {
          value.setNull(n);
        } else {
          value.setSafe(n, v.getBytes());
        }
        n++;
        batchBytes += k.getSizeInBytes() + (v == null ? 0 : v.getSizeInBytes());
        if (n == BATCH_ROWS || batchBytes >= BATCH_BYTES) {
          root.setRowCount(n);
          writer.writeBatch();
          root.allocateNew();
          n = 0;
          batchBytes = 0;
        }
      }
      if (n > 0) {
        root.setRowCount(n);
        writer.writeBatch();
      }
      writer.end();
    }
    return bytes;
  }

  /** Receives the rows of a decoded state stream: reused buffers, valid until the next row (copy what you keep). */
  public interface RowSink {
    void accept(UnsafeRow key, UnsafeRow value);
  }

  /** Readies {@link #decodeState} of typed rows of these schemas (their projections): see {@link Projections#prepare}. */
  public static void prepareDecoding(StructType keySchema, StructType valueSchema) {
    Projections.prepare(keySchema, valueSchema);
  }

  /**
   * Decodes a state stream, typed or opaque; rows with a null value are skipped (they only occur in
   * change logs). Returns whether the stream was typed (false: opaque rows of format 1).
   */
  public static boolean decodeState(InputStream in, StructType keySchema, StructType valueSchema, RowSink sink)
      throws IOException {
    return decodeState(in, keySchema, valueSchema, sink, false);
  }

  /**
   * As above; with {@code deletes}, a row with a null value reaches the sink as a delete (value null):
   * a lazy load's changes, which apply on top of a row image.
   */
  public static boolean decodeState(InputStream in, StructType keySchema, StructType valueSchema, RowSink sink,
      boolean deletes) throws IOException {
    int keyFields = keySchema.fields().length;
    int valueFields = valueSchema.fields().length;
    try (BufferAllocator alloc = ROOT.newChildAllocator("spark-state-load", 0, Long.MAX_VALUE);
         ArrowStreamReader reader = new ArrowStreamReader(in, alloc)) {
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      if (root.getVector("key") instanceof StructVector && root.getVector("value") instanceof StructVector) {
        UnsafeProjection keyProjection = Projections.borrow(keySchema);
        UnsafeProjection valueProjection = Projections.borrow(valueSchema);
        int largestRow = 0;
        try {
          while (reader.loadNextBatch()) {
            largestRow = Math.max(largestRow,
                TypedCodec.decodeBatch(root, keyProjection, valueProjection, sink, deletes));
          }
        } finally {   // the sink copied what it keeps
          Projections.giveBack(keySchema, keyProjection, largestRow);
          Projections.giveBack(valueSchema, valueProjection, largestRow);
        }
        return true;
      }
      if (!(root.getVector("key") instanceof VarBinaryVector && root.getVector("value") instanceof VarBinaryVector)) {
        throw new IOException("state stream from the worker has no typed or opaque key and value columns: "
            + root.getSchema());
      }
      VarBinaryVector key = (VarBinaryVector) root.getVector("key");
      VarBinaryVector value = (VarBinaryVector) root.getVector("value");
      UnsafeRow k = new UnsafeRow(keyFields);
      UnsafeRow v = new UnsafeRow(valueFields);
      while (reader.loadNextBatch()) {
        int n = root.getRowCount();
        long keyData = key.getDataBuffer().memoryAddress();
        long valueData = value.getDataBuffer().memoryAddress();
        for (int i = 0; i < n; i++) {
          if (value.isNull(i)) {
            if (deletes) {
              k.pointTo(null, keyData + key.getStartOffset(i), key.getValueLength(i));
              sink.accept(k, null);
            }
            continue;
          }
          // Rows over the batch's Arrow buffers, no copy: the sink copies what it keeps.
          k.pointTo(null, keyData + key.getStartOffset(i), key.getValueLength(i));
          v.pointTo(null, valueData + value.getStartOffset(i), value.getValueLength(i));
          sink.accept(k, v);
        }
      }
    }
    return false;
  }
}
