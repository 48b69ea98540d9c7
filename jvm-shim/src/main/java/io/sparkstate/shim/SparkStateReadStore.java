package io.sparkstate.shim;

/** A read-only view of one version (the provider's live one, or a private copy of another version). */
final class SparkStateReadStore extends StoreView {
  SparkStateReadStore(SparkStateProvider provider, StateVersion version) {
    super(provider, version);
  }

  @Override
  public void abort() {}

  public void release() {}

  @Override
  public String toString() {
    return "SparkStateReadStore[" + provider.stateStoreId() + ", version=" + base.version + "]";
  }
}
