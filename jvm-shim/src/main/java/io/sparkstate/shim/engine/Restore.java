package io.sparkstate.shim.engine;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * A version being restored over a row image of the checkpoint ({@link Engine#restore}): the image is
 * the bottom of the store, untouched, and the changes after it are applied on top as they are decoded,
 * blind (a restore reads no block). {@link #finish} hands over the store; {@link #abandon} drops it.
 */
public final class Restore {
  private final LayeredMap map;
  private boolean done;

  Restore(LayeredMap map) {
    this.map = map;
  }

  /** Applies one change after the image (value null: a delete). */
  public void change(UnsafeRow key, UnsafeRow value) {
    map.loadChange(key, value);
  }

  /** The restored store; {@code keys}: its exact key count when the worker knows it, else -1. */
  public StateMap finish(long keys) {
    done = true;
    if (keys >= 0) {
      map.knowSize(keys);
    }
    return map;
  }

  /** Drops what was restored (a failed load). */
  public void abandon() {
    if (!done) {
      done = true;
      map.close();
    }
  }
}
