package io.sparkstate.shim.engine;

/**
 * What one store holds in the local tier and what it did since it was made: the figures behind the
 * {@code sparkState*} metrics of a batch's progress (docs/operating.md, "Metrics").
 *
 * @param heapBytes bytes of rows held in the heap (changed since they were last written to local disk)
 * @param diskRows records in the store's runs on local disk, its bottom image included
 * @param runs runs on local disk, the bottom image included
 * @param spills times the rows in the heap were written to a new run
 * @param spilledBytes bytes those spills wrote
 * @param merges background merges of runs
 * @param mergedBytes bytes those merges wrote
 */
public record LocalStats(long heapBytes, long diskRows, int runs, long spills, long spilledBytes, long merges,
    long mergedBytes) {
  static final LocalStats NONE = new LocalStats(0, 0, 0, 0, 0, 0, 0);
}
