package io.sparkstate.shim;

import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;

import io.sparkstate.shim.engine.StateMap;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * What the read store and the writable store share: reads of one version's rows in the default column
 * family, and refusals of multiple values per key. No {@code @Override} on members Spark 4.0/4.1 lacks
 * (see {@link SparkCompat}).
 */
abstract class StoreView implements ReadStateStore {
  final SparkStateProvider provider;
  /** The version read, or (the writable store) the one its batch builds on. */
  final StateVersion base;
  final StateMap rows;

  StoreView(SparkStateProvider provider, StateVersion base) {
    this.provider = provider;
    this.base = base;
    this.rows = base.rows;
  }

  @Override
  public StateStoreId id() {
    return provider.stateStoreId();
  }

  @Override
  public long version() {
    return base.version;
  }

  @Override
  public UnsafeRow get(UnsafeRow key, String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    return rows.get(key);
  }

  /** Spark 4.2+: deduplication's lookup (no value is copied). */
  public boolean keyExists(UnsafeRow key, String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    return rows.containsKey(key);
  }

  /** Spark 4.2+: the values of a batch of keys, in their order (null where absent). */
  public scala.collection.Iterator<UnsafeRow> multiGet(UnsafeRow[] keys, String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    return CollectionConverters.asScala(Arrays.asList(rows.getAll(keys)).iterator());
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iterator(String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    return wrap(rows.iterator());
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    return wrap(rows.prefixScan(prefixKey));
  }

  @Override
  public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String colFamilyName) {
    throw Unsupported.multipleValues("valuesIterator", provider);
  }

  public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow prefixKey, String colFamilyName) {
    throw Unsupported.multipleValues("prefixScanWithMultiValues", provider);
  }

  public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String colFamilyName) {
    throw Unsupported.multipleValues("iteratorWithMultiValues", provider);
  }

  public scala.collection.immutable.Set<String> allColumnFamilyNames() {
    return CollectionConverters.asScala(Collections.singleton(StateStore.DEFAULT_COL_FAMILY_NAME())).toSet();
  }

  private static StateStoreIterator<UnsafeRowPair> wrap(Iterator<UnsafeRowPair> it) {
    return new StateStoreIterator<>(CollectionConverters.asScala(it), () -> BoxedUnit.UNIT);
  }
}
