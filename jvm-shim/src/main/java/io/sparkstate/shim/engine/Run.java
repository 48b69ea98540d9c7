package io.sparkstate.shim.engine;

import java.io.IOException;

import io.sparkstate.shim.memory.Reservation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One sorted layer of a {@link LayeredMap} on local disk: an open {@link RowImage} (its file already
 * unlinked, read through its descriptor) and what the store knows of it. A spill writes one from the
 * in-heap rows, a merge writes one from several; the bottom run is the checkpoint's own image a restore
 * started from. Runs are immutable and shared: the store and every iterator that walks it hold a
 * reference, and the file closes when the last lets go, so a merge can replace runs under a running scan.
 */
final class Run {
  private static final Logger LOG = LoggerFactory.getLogger(Run.class);
  /** {@link #batch} of a run that holds changes of more than one batch, or none of the current one. */
  static final long MIXED = -1;

  final RowImage image;
  /** The checkpoint's image (the bottom layer): never merged away, never holds tombstones. */
  final boolean bottom;
  /** The batch whose changes, and only those, this run holds ({@link #MIXED} otherwise). */
  final long batch;
  /** Bytes of the file on local disk. */
  final long fileBytes;
  /** The runs' share of the budget of the store this run belongs to (shared by its runs). */
  private final Reservation memory;
  /** What this run adds to {@link #memory}: its index and filter. */
  private final long charged;
  private int refs = 1;

  Run(RowImage image, boolean bottom, long batch, long fileBytes, Reservation memory) {
    this.image = image;
    this.bottom = bottom;
    this.batch = batch;
    this.fileBytes = fileBytes;
    this.memory = memory;
    this.charged = image.heapBytes();
    memory.add(charged);
  }

  long records() {
    return image.rows();
  }

  boolean hasTombstones() {
    return image.hasTombstones();
  }

  /** One more holder (a scan, a merge). */
  synchronized Run retain() {
    if (refs <= 0) {
      throw new IllegalStateException("spark_state: a closed run of " + image.path() + " was retained");
    }
    refs++;
    return this;
  }

  /** A holder lets go; the last one closes the file and frees the run's index and filter. */
  void release() {
    synchronized (this) {
      if (--refs > 0) {
        return;
      }
    }
    memory.add(-charged);
    try {
      image.close();
    } catch (IOException e) {
      LOG.warn("spark_state: cannot close the local state file {}: {}", image.path(), e.toString());
    }
  }

  @Override
  public String toString() {
    return (bottom ? "bottom " : "run ") + image.path() + " (" + records() + " records)";
  }
}
