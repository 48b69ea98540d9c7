package io.sparkstate.shim.engine;

import java.nio.file.Path;

/**
 * A row image cannot be used: it is corrupt or truncated, unreadable, or written by a newer
 * spark_state. Row images are derived from the checkpoint (a snapshot's image, a spill run), so the
 * answer is always the same: drop the image and reload the state from the checkpoint. Unchecked,
 * because lookups run inside Spark's {@code StateStore.get}.
 *
 * <p>A remote image's bytes that could not be fetched (the checkpoint storage did not answer) are not
 * damage ({@link #damaged}): the task fails, and its retry may restore from the image again.
 */
public final class RowImageException extends IllegalStateException {
  private static final String RELOAD = "; the store will reload its state from the checkpoint";

  private final boolean damaged;

  private RowImageException(String message, Throwable cause, boolean damaged) {
    super(message, cause);
    this.damaged = damaged;
  }

  /** Whether the file is damaged (or newer): not a failed fetch of a remote image's bytes. */
  public boolean damaged() {
    return damaged;
  }

  static RowImageException corrupt(Path path, String what) {
    return corrupt(String.valueOf(path), what);
  }

  static RowImageException corrupt(String file, String what) {
    return new RowImageException("spark_state: the state file " + file + " is corrupt: " + what + RELOAD, null, true);
  }

  static RowImageException corrupt(String file, int block, int blocks, String what) {
    return corrupt(file, "block " + block + " of " + blocks + ": " + what);
  }

  static RowImageException unreadable(String file, Throwable cause) {
    return new RowImageException("spark_state: cannot read the state file " + file + " (" + cause + ")" + RELOAD,
        cause, true);
  }

  /** A remote image's bytes could not be fetched from the checkpoint storage (through the worker). */
  static RowImageException unfetched(String file, Throwable cause) {
    return new RowImageException("spark_state: cannot fetch bytes of the row image " + file + " from the checkpoint "
        + "storage (" + cause + "); the task fails and its retry restores the state again", cause, false);
  }

  /**
   * A remote image's bytes the checkpoint storage does not have: the file is gone or shorter than its manifest
   * says. Damage, not a failed fetch: a retry would meet it again, so the store reloads rows instead.
   */
  public static RowImageException lost(String file, Throwable cause) {
    return new RowImageException("spark_state: the row image " + file + " is not the file its manifest names ("
        + cause.getMessage() + ")" + RELOAD, cause, true);
  }

  /** The damage a failed read of a remote image's bytes carries, if any (see {@link #lost}). */
  static RowImageException damageIn(Throwable failure) {
    for (Throwable t = failure; t != null; t = t.getCause()) {
      if (t instanceof RowImageException r && r.damaged) {
        return r;
      }
    }
    return null;
  }

  static RowImageException newer(String file, String what) {
    return new RowImageException("spark_state: the state file " + file + " was written by a newer spark_state ("
        + what + "): upgrade spark_state on the executors" + RELOAD, null, true);
  }
}
