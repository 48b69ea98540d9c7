package io.sparkstate.shim.engine;

import java.nio.file.Path;

/**
 * A row image cannot be used: it is corrupt or truncated, unreadable, or written by a newer
 * spark_state. Row images are derived from the checkpoint (a snapshot's image, a spill run), so the
 * answer is always the same: drop the image and reload the state from the checkpoint. Unchecked,
 * because lookups run inside Spark's {@code StateStore.get}.
 */
public final class RowImageException extends IllegalStateException {
  private static final String RELOAD = "; the store will reload its state from the checkpoint";

  final transient Path path;

  private RowImageException(Path path, String message, Throwable cause) {
    super(message, cause);
    this.path = path;
  }

  static RowImageException corrupt(Path path, String what) {
    return new RowImageException(path, "spark_state: the state file " + path + " is corrupt: " + what + RELOAD, null);
  }

  static RowImageException corrupt(Path path, int block, int blocks, String what) {
    return corrupt(path, "block " + block + " of " + blocks + ": " + what);
  }

  static RowImageException unreadable(Path path, Throwable cause) {
    return new RowImageException(path, "spark_state: cannot read the state file " + path + " (" + cause + ")" + RELOAD,
        cause);
  }

  static RowImageException newer(Path path, String what) {
    return new RowImageException(path, "spark_state: the state file " + path + " was written by a newer spark_state ("
        + what + "): upgrade spark_state on the executors" + RELOAD, null);
  }
}
