package io.sparkstate.shim.codec;

/**
 * Where a {@link ChangeLog} sends the chunks it cuts while the batch runs (the worker client's change
 * stream): a typed log streams every {@link #CHUNK_BYTES} of encoded changes, so the commit ships only
 * the rest and the log never holds a batch's changes.
 */
public interface ChunkSink {
  /**
   * Encoded bytes per chunk ({@code -Dio.sparkstate.streamChunkBytes}; tests stream tiny batches): about one
   * Arrow batch of changes, so what is left for the commit is at most about one batch.
   */
  long CHUNK_BYTES = Long.getLong("io.sparkstate.streamChunkBytes", 512L << 10);

  /** Sends {@code chunk} (a complete Arrow stream of changes) after the chunks before it. */
  void send(ArrowCodec.Body chunk);

  /** Chunks sent so far. */
  int chunks();

  /** Drops what was sent (an aborted or closed log). Idempotent. */
  void discard();
}
