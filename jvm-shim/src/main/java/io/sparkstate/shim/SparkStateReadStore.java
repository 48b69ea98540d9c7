package io.sparkstate.shim;

/** A read-only view of one version (the provider's live one, or a private copy of another version). */
final class SparkStateReadStore extends StoreView {
  /** The rows are a private copy of this store's (closed with it), not the provider's live version. */
  private final boolean owned;

  SparkStateReadStore(SparkStateProvider provider, StateVersion version, boolean owned) {
    super(provider, version);
    this.owned = owned;
  }

  @Override
  public void abort() {
    release();
  }

  public void release() {
    if (owned) {
      rows.close();
    }
  }

  @Override
  public String toString() {
    return "SparkStateReadStore[" + provider.stateStoreId() + ", version=" + base.version + "]";
  }
}
