package io.sparkstate.shim.codec;

import java.io.IOException;
import java.util.Iterator;

import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.StructType;

/**
 * How one store's rows travel to the worker (docs/protocol.md), chosen once per provider by
 * {@link #of}: typed struct columns (file format 2) when Spark's Arrow conversion maps the store's
 * schemas, else opaque {@code UnsafeRow} bytes (format 1). It encodes whole versions and makes each
 * batch's {@link ChangeLog}: typed changes are encoded as they happen ({@link ArrowChangeLog}),
 * opaque ones kept as rows until commit ({@link MapChangeLog}), their encoding being a copy anyway.
 *
 * @param typed whether rows are typed (file format 2); else opaque (format 1)
 * @param encoding how whole versions are encoded
 * @param changeLogs how a batch's change log is made
 */
public record RowFormat(boolean typed, RowFormat.Encoding encoding, RowFormat.ChangeLogs changeLogs) {
  /**
   * Test hook, read when a provider is created: {@code -Dspark_state.opaqueRows=true} makes it write
   * opaque rows whatever its schemas, as an executor whose Spark cannot map them does. A test needs
   * executors that disagree on the format inside one running JVM (tests/test_format1_fixture.py);
   * the benchmarks' variants override {@link SparkStateProvider#rowFormat} instead.
   */
  static final String OPAQUE_ROWS_PROPERTY = "spark_state.opaqueRows";

  /** Encodes rows (null value = delete) as one Arrow stream ({@code expected}: about how many). */
  public interface Encoding {
    public ArrowCodec.Body encode(Iterator<UnsafeRowPair> rows, long expected) throws IOException;
  }

  /**
   * Makes the change log of one batch ({@code expected}: a guess of its changes; {@code stream}: where a
   * log that streams sends its chunks during the batch, or null).
   */
  public interface ChangeLogs {
    public ChangeLog newChangeLog(RowFormat format, long expected, ChunkSink stream);
  }

  /** The format of a store with these schemas. */
  public static RowFormat of(StructType keySchema, StructType valueSchema, KeyHasher hasher) {
    TypedCodec codec = Boolean.getBoolean(OPAQUE_ROWS_PROPERTY) ? null : TypedCodec.forSchemas(keySchema, valueSchema);
    return codec == null ? opaque(hasher) : typed(codec, hasher);
  }

  /** Typed rows, converted by {@code codec}. */
  public static RowFormat typed(TypedCodec codec, KeyHasher hasher) {
    return new RowFormat(true, (rows, expected) -> codec.encode(rows, expected, hasher),
        (format, expected, stream) -> new ArrowChangeLog(codec, hasher, expected, stream));
  }

  /** Opaque row bytes. */
  public static RowFormat opaque(KeyHasher hasher) {
    return new RowFormat(false, (rows, expected) -> ArrowCodec.encodeOpaque(rows, expected, hasher),
        (format, expected, stream) -> new MapChangeLog(format, expected));
  }

  /** The same format with other change logs (a benchmark variant). */
  public RowFormat withChangeLogs(ChangeLogs other) {
    return new RowFormat(typed, encoding, other);
  }

  /** The change log of one batch ({@code expected}: a guess of its changes; {@code stream}: see ChangeLogs). */
  public ChangeLog newChangeLog(long expected, ChunkSink stream) {
    return changeLogs.newChangeLog(this, expected, stream);
  }

  /** Encodes rows (null value = delete) as one Arrow stream ({@code expected}: about how many). */
  public ArrowCodec.Body encode(Iterator<UnsafeRowPair> rows, long expected) throws IOException {
    return encoding.encode(rows, expected);
  }
}
