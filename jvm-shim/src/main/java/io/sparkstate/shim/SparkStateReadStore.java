package io.sparkstate.shim;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/** A read-only view of one version (the provider's live map, or a private copy of an older version). */
final class SparkStateReadStore implements ReadStateStore {
  // No @Override on members Spark 4.0/4.1 lacks (multi-value scans, release, allColumnFamilyNames).
  private final SparkStateProvider provider;
  private final StateMap map;
  private final long version;

  SparkStateReadStore(SparkStateProvider provider, StateMap map, long version) {
    this.provider = provider;
    this.map = map;
    this.version = version;
  }

  @Override
  public StateStoreId id() {
    return provider.stateStoreId();
  }

  @Override
  public long version() {
    return version;
  }

  @Override
  public UnsafeRow get(UnsafeRow key, String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    return map.get(key);
  }

  @Override
  public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String colFamilyName) {
    throw provider.multipleValuesUnsupported("valuesIterator");
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    return SparkStateStore.wrap(map.prefixScan(prefixKey));
  }

  public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow prefixKey, String colFamilyName) {
    throw provider.multipleValuesUnsupported("prefixScanWithMultiValues");
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iterator(String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    return SparkStateStore.wrap(map.iterator());
  }

  public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String colFamilyName) {
    throw provider.multipleValuesUnsupported("iteratorWithMultiValues");
  }

  @Override
  public void abort() {}

  public void release() {}

  public scala.collection.immutable.Set<String> allColumnFamilyNames() {
    return SparkStateStore.defaultFamilyOnly();
  }

  @Override
  public String toString() {
    return "SparkStateReadStore[" + provider.stateStoreId() + ", version=" + version + "]";
  }
}
