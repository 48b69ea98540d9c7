package io.sparkstate.shim;

import org.apache.spark.TaskContext;
import org.apache.spark.util.TaskCompletionListener;

/** A read-only view of one version (the provider's live one, or a private copy of another version). */
final class SparkStateReadStore extends StoreView {
  /** The rows are a private copy of this store's (closed with it), not the provider's live version. */
  private final boolean owned;

  private boolean released;

  /** Released when its task ends, if Spark has not released it before. */
  SparkStateReadStore(SparkStateProvider provider, StateVersion version, boolean owned) {
    super(provider, version);
    this.owned = owned;
    TaskContext ctx = TaskContext.get();
    if (ctx != null) {
      ctx.addTaskCompletionListener((TaskCompletionListener) c -> release());
    }
  }

  @Override
  public void abort() {
    release();
  }

  public void release() {
    synchronized (this) {
      if (released) {
        return;
      }
      released = true;
    }
    if (owned) {
      rows.close();
    } else {
      provider.released(this);
    }
  }

  @Override
  public String toString() {
    return "SparkStateReadStore[" + provider.stateStoreId() + ", version=" + base.version + "]";
  }
}
