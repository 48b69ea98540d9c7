package io.sparkstate.shim.codec;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Collections;

import io.sparkstate.shim.memory.MemoryBudget;
import io.sparkstate.shim.memory.Reservation;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * Typed changes (file format 2) encoded into an Arrow stream as they happen, as HDFS's provider writes
 * its delta file during the batch; every {@link ChunkSink#CHUNK_BYTES} of it is cut off and streamed
 * to the worker (when the log has a {@link ChunkSink}), so commit ships only the rest and the log holds
 * about a chunk whatever the batch. A key changed twice is in it twice (the store says so, see
 * {@link ChangeLog#add}), and the worker then keeps each key's last row. The stream and its Arrow memory
 * are created at the first change.
 */
public final class ArrowChangeLog implements ChangeLog {
  /** Rows a streaming log's first buffer is sized for: about a chunk. */
  private static final long CHUNK_ROWS = 2L * ArrowCodec.BATCH_ROWS;
  private final TypedCodec codec;
  private final KeyHasher hasher;
  private final long expected;
  private final ChunkSink stream;
  private TypedCodec.Encoder encoder;
  private boolean repeated;
  /** The encoder's bytes and vectors: the budget's "changes" reservation. */
  private final Reservation held = MemoryBudget.executor().reserve("changes", this);

  /**
   * {@code expected}: a guess of the batch's changes (sizes the first buffer);
   * {@code stream}: where full chunks go during the batch (null: everything at commit).
   */
  ArrowChangeLog(TypedCodec codec, KeyHasher hasher, long expected, ChunkSink stream) {
    this.codec = codec;
    this.hasher = hasher;
    this.expected = expected;
    this.stream = stream;
  }

  @Override
  public void add(UnsafeRow key, UnsafeRow value, boolean again) {
    try {
      if (encoder == null) {
        // a streaming log's buffer holds one chunk (it leaves with it), not the whole batch
        encoder = codec.newEncoder(stream == null ? expected : Math.min(expected, CHUNK_ROWS), hasher);
      }
      encoder.add(key, value);
      repeated |= again;
      if (encoder.betweenBatches()) {   // a batch was just encoded
        if (stream != null && encoder.encodedBytes() >= ChunkSink.CHUNK_BYTES) {
          stream.send(encoder.cut((int) Math.min(ChunkSink.CHUNK_BYTES * 2, 1 << 26)));
        }
        held.set(encoder.encodedBytes() + encoder.vectorBytes());
      }
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
    return repeated;
  }

  @Override
  public ArrowCodec.Body finish() throws IOException {
    if (encoder == null) {
      return codec.encode(Collections.emptyIterator(), 0, hasher);
    }
    ArrowCodec.Body body = encoder.finish();
    encoder = null;
    held.set(0);
    return body;
  }

  @Override
  public void close() {
    if (encoder != null) {
      encoder.close();
      encoder = null;
    }
    held.set(0);
    if (stream != null) {
      stream.discard();
    }
  }
}
