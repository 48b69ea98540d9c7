package io.sparkstate.shim;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Collections;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * Typed changes (file format 2) encoded into an Arrow stream as they happen, as HDFS's provider writes
 * its delta file during the batch: commit only finishes and ships the stream. A key changed twice is
 * in it twice; {@link KeyFingerprints} tell whether that may have happened, so the worker dedups only
 * then. The stream and its Arrow memory are created at the first change.
 */
final class ArrowChangeLog implements ChangeLog {
  private final TypedCodec codec;
  private final KeyHasher hasher;
  private final long expected;
  private TypedCodec.Encoder encoder;
  private KeyFingerprints keys;

  /** {@code expected}: a guess of the batch's changes (sizes the stream and the fingerprints). */
  ArrowChangeLog(TypedCodec codec, KeyHasher hasher, long expected) {
    this.codec = codec;
    this.hasher = hasher;
    this.expected = expected;
  }

  @Override
  public void add(UnsafeRow key, UnsafeRow value) {
    try {
      if (encoder == null) {
        encoder = codec.newEncoder(expected, hasher);
        keys = new KeyFingerprints(expected);
      }
      keys.add(encoder.add(key, value), key);
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot encode a change", e);
    }
  }

  @Override
  public long size() {
    return encoder == null ? 0 : encoder.rows();
  }

  @Override
  public boolean mayRepeatKeys() {
    return keys != null && keys.repeated();
  }

  @Override
  public ArrowCodec.Body finish() throws IOException {
    if (encoder == null) {
      return codec.encode(Collections.emptyIterator(), 0, hasher);
    }
    ArrowCodec.Body body = encoder.finish();
    encoder = null;
    keys = null;
    return body;
  }

  @Override
  public void close() {
    if (encoder != null) {
      encoder.close();
      encoder = null;
      keys = null;
    }
  }
}
