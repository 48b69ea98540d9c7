package io.sparkstate.shim.codec;

import java.io.IOException;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * The changes of one batch (key → new value, null = delete), recorded as they happen and shipped as
 * Arrow streams of docs/protocol.md: typed logs stream full chunks to the worker while the batch runs
 * ({@link ChunkSink}), and commit ships the rest. There is no undo: an aborted batch only closes its
 * log (the provider drops the map it changed; the worker drops what was streamed). A delete may name a key that was absent before the
 * batch (put and removed in it); the worker drops deletes of unknown keys.
 *
 * <p>{@link RowFormat#newChangeLog} picks the implementation: {@link ArrowChangeLog} (typed rows,
 * encoded at each change) or {@link MapChangeLog} (opaque rows, encoded at commit).
 */
public interface ChangeLog extends AutoCloseable {
  /**
   * Records that {@code key} now has {@code value} (null: removed). Copies what it keeps. {@code again}:
   * the batch changed the key before (the store knows: it looked the key up anyway), so the log names it
   * twice and the worker keeps its last row.
   */
  void add(UnsafeRow key, UnsafeRow value, boolean again);

  /** Changes recorded so far (a key changed twice may count twice). */
  long size();

  /** Whether the stream may name a key more than once (the worker then keeps each key's last row). */
  default boolean mayRepeatKeys() {
    return false;
  }

  /** The changes not streamed yet, as one Arrow stream (all of them without a stream). */
  ArrowCodec.Body finish() throws IOException;

  /** Frees what the log holds without encoding it, dropping what was streamed; idempotent. Only on the thread that adds. */
  @Override
  void close();
}
