package io.sparkstate.shim.engine;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Iterator;
import java.util.concurrent.CompletableFuture;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/**
 * A store restored over a remote row image whose changes after the image are still on their way (a deferred
 * load: the worker answered with the image as soon as it had read the manifest). The first call that reads or
 * writes rows applies the changes first ({@link Changes}), so nothing ever sees the image without them; a
 * first {@code get} meanwhile looks its key up in the image on another thread, so the changes' read and the
 * lookup's block fetch overlap: a restore's first lookup waits one round trip of the storage less.
 * {@link #stats}, {@link #endBatch} and {@link #close} do not need the changes.
 */
public final class DeferredRestore implements StateMap {
  /** Applies the changes after the image to a restore ({@link Restore#change}); run once, on first use. */
  public interface Changes {
    void applyTo(Restore restore) throws IOException;
  }

  private final Restore restore;
  private final long keys;
  private Changes changes;
  /** The store with its changes, once applied. */
  private volatile StateMap rows;
  private boolean batchEnded;
  private boolean closed;

  /** {@code keys}: the version's exact key count when the worker knew it, else -1 ({@link Restore#finish}). */
  public DeferredRestore(Restore restore, long keys, Changes changes) {
    this.restore = restore;
    this.keys = keys;
    this.changes = changes;
  }

  /** Whether the changes were applied (tests, diagnostics). */
  public boolean settled() {
    return rows != null;
  }

  private StateMap rows() {
    StateMap r = rows;
    return r != null ? r : settle(null);
  }

  /**
   * Applies the changes, then makes the store whole. A failure (the worker or storage) is the caller's, and the
   * next call applies them again: they hold each key once, so applying them twice changes nothing, and a task's
   * retry that finds this version still current (its commit unchanged) gets a store that works.
   * {@code lookup}: a lookup in the image running meanwhile, waited for first.
   */
  private synchronized StateMap settle(CompletableFuture<Void> lookup) {
    if (rows != null) {
      return rows;
    }
    if (closed) {
      throw new IllegalStateException("spark_state: the store is closed");
    }
    try {
      changes.applyTo(restore);
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot read the changes after a row image", e);
    } finally {
      if (lookup != null) {
        lookup.exceptionally(e -> null).join();   // it swallows its failures; nothing else may escape here
        restore.resumeBackground();
      }
    }
    changes = null;
    StateMap done = restore.finish(keys);
    if (batchEnded) {
      done.endBatch();
    }
    rows = done;
    return done;
  }

  @Override
  public UnsafeRow get(UnsafeRow key) {
    StateMap r = rows;
    if (r == null) {
      r = firstGet(key);
    }
    return r.get(key);
  }

  private StateMap firstGet(UnsafeRow key) {
    synchronized (this) {
      if (rows != null || closed) {
        return rows();
      }
      return settle(restore.lookUpInImage(key));
    }
  }

  @Override
  public long size() {
    return rows().size();
  }

  @Override
  public long knownSize() {
    return rows().knownSize();
  }

  @Override
  public long bytes() {
    return rows().bytes();
  }

  @Override
  public boolean containsKey(UnsafeRow key) {
    return rows().containsKey(key);
  }

  @Override
  public UnsafeRow[] getAll(UnsafeRow[] keys) {
    return rows().getAll(keys);
  }

  @Override
  public int put(UnsafeRow key, UnsafeRow value) {
    return rows().put(key, value);
  }

  @Override
  public int remove(UnsafeRow key) {
    return rows().remove(key);
  }

  @Override
  public Iterator<UnsafeRowPair> iterator() {
    return rows().iterator();
  }

  @Override
  public Iterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    return rows().prefixScan(prefixKey);
  }

  @Override
  public LocalStats stats() {
    StateMap r = rows;
    return r != null ? r.stats() : restore.map().stats();
  }

  @Override
  public synchronized void endBatch() {
    if (rows != null) {
      rows.endBatch();
    } else {
      batchEnded = true;   // applied after the changes, as a restore that had them would have
    }
  }

  @Override
  public synchronized void close() {
    if (rows != null) {
      rows.close();
    } else if (!closed) {
      closed = true;
      changes = null;
      restore.abandon();   // the worker drops changes nobody takes
    }
  }
}
