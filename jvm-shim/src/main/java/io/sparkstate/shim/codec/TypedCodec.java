package io.sparkstate.shim.codec;

import java.io.IOException;
import java.util.Iterator;

import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;

import io.sparkstate.shim.schema.SchemaCache;

/**
 * Typed rows of docs/protocol.md ({@code kg, hash, key: struct, value: struct}): the key and value
 * {@link UnsafeRow}s as Arrow struct columns, converted by Spark's own Arrow utilities (the ones
 * PySpark's Arrow path uses), so every Spark type maps exactly as Spark maps it. Only conversion;
 * the worker owns the file format.
 */
public final class TypedCodec {
  /** Timestamps are instants: labelled UTC, as the values Spark holds are UTC microseconds. */
  static final String TIME_ZONE = "UTC";

  private final StructType rowType;
  private final StructType keySchema;
  private final StructType valueSchema;
  /** Rows of flat schemas are written by {@link FlatStructWriter}, others by ArrowWriter. */
  private final boolean flat;

  private TypedCodec(StructType keySchema, StructType valueSchema, boolean allowFlat) {
    this.keySchema = keySchema;
    this.valueSchema = valueSchema;
    this.flat = allowFlat && FlatStructWriter.supports(keySchema) && FlatStructWriter.supports(valueSchema);
    this.rowType = DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("kg", DataTypes.IntegerType, true),
        DataTypes.createStructField("hash", DataTypes.IntegerType, true),
        DataTypes.createStructField("key", keySchema, false),
        DataTypes.createStructField("value", valueSchema, true)});
  }

  /**
   * The codec for a store's schemas, or null when Spark's Arrow conversion cannot map one of their
   * types (the store then keeps opaque row bytes, file format 1).
   */
  static TypedCodec forSchemas(StructType keySchema, StructType valueSchema) {
    java.util.List<StructType> schemas = java.util.List.of(keySchema, valueSchema);
    TypedCodec codec = FOR_SCHEMAS.get(schemas);
    if (codec != null) {
      return codec;
    }
    TypedCodec made = create(keySchema, valueSchema, true);
    // "opaque" (null) is not kept: a transient failure to make a writer must not pin a schema to it
    return made == null ? null : FOR_SCHEMAS.computeIfAbsent(schemas, k -> made);
  }

  /** {@link #forSchemas}' codecs: finding one makes an ArrowWriter (milliseconds), and a codec holds no state. */
  private static final SchemaCache<java.util.List<StructType>, TypedCodec> FOR_SCHEMAS = new SchemaCache<>();

  /**
   * The codec that writes every schema with Spark's ArrowWriter, never {@link FlatStructWriter}: the
   * reference the flat writer is compared with (tests/jvm/EncoderProbe.java, a benchmark variant).
   */
  public static TypedCodec arrowWriterOnly(StructType keySchema, StructType valueSchema) {
    return create(keySchema, valueSchema, false);
  }

  private static TypedCodec create(StructType keySchema, StructType valueSchema, boolean allowFlat) {
    TypedCodec codec = new TypedCodec(keySchema, valueSchema, allowFlat);
    try {
      ArrowWriter writer = codec.newWriter();
      writer.root().close();
      return codec;
    } catch (RuntimeException e) {
      return null;
    }
  }

  private ArrowWriter newWriter() {
    return ArrowWriter.create(rowType, TIME_ZONE, false, false);
  }

  /** Whether rows are written by {@link FlatStructWriter} (else by Spark's ArrowWriter). */
  boolean flat() {
    return flat;
  }

  /** Encodes rows (null value = delete) as one Arrow stream of typed batches. */
  ArrowCodec.Body encode(Iterator<UnsafeRowPair> rows, long expected, KeyHasher hasher) throws IOException {
    try (Encoder encoder = newEncoder(expected, hasher)) {
      while (rows.hasNext()) {
        UnsafeRowPair row = rows.next();
        encoder.add(row.key(), row.value());
      }
      return encoder.finish();
    }
  }

  /** An open stream to append rows to, one at a time ({@code expected}: a guess of the row count). */
  Encoder newEncoder(long expected, KeyHasher hasher) throws IOException {
    return new Encoder(expected, hasher);
  }

  /**
   * An Arrow stream of typed rows being written: rows go into the vectors as they are added, each
   * full batch into the stream's bytes. Flat schemas are written by {@link FlatStructWriter} into
   * the vectors ArrowWriter created (so the schema is Spark's), others by ArrowWriter itself.
   * Holds Arrow memory until {@link #finish} or {@link #close}.
   */
  final class Encoder implements AutoCloseable {
    private final KeyHasher hasher;
    private ArrowCodec.Body bytes;
    private final ArrowWriter arrow;
    private final VectorSchemaRoot root;
    private ArrowStreamWriter writer;
    private final IntVector kg;
    private final IntVector hash;
    private final FlatStructWriter key;
    private final FlatStructWriter value;
    private final GenericInternalRow row = new GenericInternalRow(4);
    private int n;
    private long batchBytes;
    /** Encoded bytes of the last batch written: about what the vectors hold (their buffers are kept). */
    private long lastBatch;
    private long rows;
    private boolean closed;

    private Encoder(long expected, KeyHasher hasher) throws IOException {
      this.hasher = hasher;
      this.bytes = new ArrowCodec.Body((int) Math.max(1024, Math.min(expected, 1 << 22) * 48));
      this.arrow = newWriter();
      this.root = arrow.root();
      try {
        this.writer = new ArrowStreamWriter(root, null, bytes);
        this.kg = (IntVector) root.getVector("kg");
        this.hash = (IntVector) root.getVector("hash");
        this.key = flat ? new FlatStructWriter(keySchema, (StructVector) root.getVector("key")) : null;
        this.value = flat ? new FlatStructWriter(valueSchema, (StructVector) root.getVector("value")) : null;
        writer.start();
      } catch (IOException | RuntimeException e) {
        root.close();
        throw e;
      }
    }

    /** Appends a row (null value = delete); returns the key's hash. */
    int add(UnsafeRow k, UnsafeRow v) throws IOException {
      int h = hasher.hash(k);
      if (flat) {
        kg.setSafe(n, hasher.keyGroup(h));
        hash.setSafe(n, h);
        key.write(n, k);
        value.write(n, v);
      } else {
        row.update(0, hasher.keyGroup(h));
        row.update(1, h);
        row.update(2, k);
        row.update(3, v);
        arrow.write(row);
      }
      n++;
      rows++;
      batchBytes += k.getSizeInBytes() + (v == null ? 0 : v.getSizeInBytes());
      if (n == ArrowCodec.BATCH_ROWS || batchBytes >= ArrowCodec.BATCH_BYTES) {
        flush();
      }
      return h;
    }

    /** Rows added so far. */
    long rows() {
      return rows;
    }

    /** Bytes of the stream so far (its full batches; the rows of the open batch are not encoded yet). */
    long encodedBytes() {
      return bytes.size();
    }

    /** Whether every row added is in a full batch of the stream (the moment a {@link #cut} may happen). */
    boolean betweenBatches() {
      return n == 0;
    }

    /**
     * Ends the stream so far and returns its bytes (a complete Arrow stream), and starts a new stream for
     * the rows after: a change log ships its changes as a sequence of such chunks. Only between batches.
     */
    ArrowCodec.Body cut(int nextBytes) throws IOException {
      if (n != 0) {
        throw new IllegalStateException("spark_state: a stream is cut only between batches");
      }
      writer.end();
      ArrowCodec.Body done = bytes;
      bytes = new ArrowCodec.Body(nextBytes);
      writer = new ArrowStreamWriter(root, null, bytes);
      writer.start();
      return done;
    }

    /** About the Arrow memory the vectors hold (they keep their buffers between batches). */
    long vectorBytes() {
      return lastBatch;
    }

    private void flush() throws IOException {
      long before = bytes.size();
      if (flat) {
        root.setRowCount(n);
        writer.writeBatch();
        resetVectors(root);
      } else {
        arrow.finish();
        writer.writeBatch();
        arrow.reset();
      }
      n = 0;
      batchBytes = 0;
      lastBatch = bytes.size() - before;
    }

    /** Writes the last batch and the end of the stream, frees the vectors and returns the bytes. */
    ArrowCodec.Body finish() throws IOException {
      try {
        if (n > 0) {
          flush();
        }
        writer.end();
      } finally {
        close();
      }
      return bytes;
    }

    @Override
    public void close() {
      if (!closed) {
        closed = true;
        root.close();
      }
    }
  }

  /** What ArrowWriter.reset does: empties every vector, keeping its buffers. */
  private static void resetVectors(VectorSchemaRoot root) {
    root.setRowCount(0);
    for (FieldVector v : root.getFieldVectors()) {
      v.reset();
    }
  }

  /**
   * Decodes one batch of a typed state stream; rows with a null value are skipped. The rows passed to
   * the sink are the projections' buffers, valid until the next row (the sink copies what it keeps).
   * Returns the size of the largest key or value made (bytes).
   */
  static int decodeBatch(VectorSchemaRoot root, UnsafeProjection keyProjection, UnsafeProjection valueProjection,
      ArrowCodec.RowSink sink, boolean deletes) {
    ArrowColumnVector key = new ArrowColumnVector(root.getVector("key"));
    ArrowColumnVector value = new ArrowColumnVector(root.getVector("value"));
    int n = root.getRowCount();
    int largest = 0;
    for (int i = 0; i < n; i++) {
      UnsafeRow k = keyProjection.apply(key.getStruct(i));
      largest = Math.max(largest, k.getSizeInBytes());
      if (value.isNullAt(i)) {
        if (deletes) {
          sink.accept(k, null);
        }
        continue;
      }
      UnsafeRow v = valueProjection.apply(value.getStruct(i));
      largest = Math.max(largest, v.getSizeInBytes());
      sink.accept(k, v);
    }
    return largest;
  }

  /**
   * Converts one row of a small schema to Arrow and back, so the classes a store's first commit and
   * load use (Arrow vectors and IPC, Spark's ArrowWriter and projections, the code generator) are
   * loaded before the first task needs them. Called by the executor plugin, in the background.
   */
  public static void warmUp() throws IOException {
    StructType key = DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("k", DataTypes.LongType, false)});
    StructType value = DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("n", DataTypes.LongType, true),
        DataTypes.createStructField("s", DataTypes.StringType, true),
        DataTypes.createStructField("d", DataTypes.DoubleType, true)});
    TypedCodec codec = forSchemas(key, value);
    if (codec == null) {
      return;
    }
    UnsafeRow k = UnsafeProjection.create(key).apply(new GenericInternalRow(new Object[] {1L})).copy();
    UnsafeRow v = UnsafeProjection.create(value).apply(new GenericInternalRow(new Object[] {
        2L, org.apache.spark.unsafe.types.UTF8String.fromString("warm-up"), 0.5})).copy();
    KeyHasher hasher = new KeyHasher(key, 1, KeyHasher.DEFAULT_MAX_PARALLELISM);
    ArrowCodec.Body body = codec.encode(java.util.List.of(new UnsafeRowPair(k, v)).iterator(), 1, hasher);
    java.io.ByteArrayOutputStream bytes = new java.io.ByteArrayOutputStream();
    body.writeTo(bytes);
    ArrowCodec.decodeState(new java.io.ByteArrayInputStream(bytes.toByteArray()), key, value, (a, b) -> { });
  }
}
