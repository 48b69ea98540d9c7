package io.sparkstate.shim.engine;

import java.io.IOException;
import java.io.InputStream;

/**
 * Reads byte ranges of one image on the checkpoint storage: the worker's {@code fetch} request (the JVM
 * speaks no storage protocol). Implemented on Spark's side of the shim, called from task threads (a
 * lookup's block) and from the image cache's fill threads.
 */
public interface RangeReader {
  /**
   * Reads the ranges [from[i], to[i]) and hands {@code body} their bytes one range after the other, exactly
   * {@code to[i] - from[i]} bytes each. A failure to fetch (storage, worker) is an IOException.
   */
  void fetch(long[] from, long[] to, Body body) throws IOException;

  /** Consumes the fetched bytes while the reply is held. */
  interface Body {
    void read(InputStream bytes) throws IOException;
  }
}
