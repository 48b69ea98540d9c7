package io.sparkstate.shim.engine;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * A version being restored over a row image of the checkpoint ({@link Engine#restore}): the image is
 * the bottom of the store, untouched, and the changes after it are applied on top as they are decoded,
 * blind (a restore reads no block). {@link #finish} hands over the store; {@link #abandon} drops it.
 */
public final class Restore {
  private final LayeredMap map;
  private final RowImage image;
  private final KeyOrder order;
  private final Executor lookups;
  private boolean done;

  Restore(LayeredMap map, RowImage image, KeyOrder order, Executor lookups) {
    this.map = map;
    this.image = image;
    this.order = order;
    this.lookups = lookups;
  }

  /**
   * Looks {@code key} up in the image alone on another thread, and answers when that is done; a failure is left
   * for the store's own lookup to meet. It reads what the store's lookup of the key will read (a remote image's
   * index page and block), while the caller does something else: {@link DeferredRestore} waits for the changes.
   * It touches only the image, never the map, so it may run beside {@link #change}.
   */
  CompletableFuture<Void> lookUpInImage(UnsafeRow key) {
    int hash = order.hash(key);
    int keyGroup = order.keyGroup(hash);
    UnsafeRow copy = key.copy();
    image.source().holdBackground();   // until the restore settles: the fill would compete with the changes
    return CompletableFuture.runAsync(() -> {
      try {
        image.get(keyGroup, hash, copy);
      } catch (RuntimeException e) {   // the store's lookup reads the same and fails as a lookup does
      }
    }, lookups);
  }

  /** Lets the image's background work start as its lookups ask (after {@link #lookUpInImage}). */
  void resumeBackground() {
    image.source().resumeBackground();
  }

  /** The store being restored, before {@link #finish} (its metrics; nothing that reads it). */
  StateMap map() {
    return map;
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
