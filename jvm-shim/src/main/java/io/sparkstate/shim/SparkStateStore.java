package io.sparkstate.shim;

import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreCheckpointInfo;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.TaskCompletionListener;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * The open (writable) store of one version: mutates the provider's live map in place and keeps a
 * change log (key → new value, null = delete) for commit and an undo log (key → value at
 * {@code version}, null = absent) for abort, so no copy of the map is made per batch.
 */
final class SparkStateStore implements StateStore {
  private enum State { UPDATING, COMMITTED, ABORTED }

  private final SparkStateProvider provider;
  private final StateMap map;
  private final long version;
  private final LinkedHashMap<UnsafeRow, UnsafeRow> changes = new LinkedHashMap<>();
  private final HashMap<UnsafeRow, UnsafeRow> undo = new HashMap<>();
  private volatile State state = State.UPDATING;
  private boolean commitSent;

  // metrics of this store's batch
  private final long loadTimeMs;
  private final long restartsAtStart;
  private long commitTimeMs;
  private long bytesWritten;

  SparkStateStore(SparkStateProvider provider, StateMap map, long version, long loadTimeMs, long restartsAtStart) {
    this.provider = provider;
    this.map = map;
    this.version = version;
    this.loadTimeMs = loadTimeMs;
    this.restartsAtStart = restartsAtStart;
    TaskContext ctx = TaskContext.get();
    if (ctx != null) {
      ctx.addTaskCompletionListener((TaskCompletionListener) c -> {
        if (state == State.UPDATING) {
          abort();
        }
      });
    }
  }

  StateMap map() {
    return map;
  }

  boolean isUpdating() {
    return state == State.UPDATING;
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
  public void put(UnsafeRow key, UnsafeRow value, String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    if (value == null) {
      throw new IllegalArgumentException("spark_state: cannot put a null value");
    }
    checkUpdating("put");
    UnsafeRow k = key.copy();
    UnsafeRow v = value.copy();
    UnsafeRow old = map.put(k, v);
    if (!undo.containsKey(k)) {
      undo.put(k, old);
    }
    changes.put(k, v);
  }

  @Override
  public void remove(UnsafeRow key, String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    checkUpdating("remove");
    UnsafeRow old = map.remove(key);
    if (old == null) {
      return;
    }
    UnsafeRow k = key.copy();
    if (!undo.containsKey(k)) {
      undo.put(k, old);
    }
    if (undo.get(k) == null) {
      changes.remove(k); // absent at `version`: added and removed in this batch
    } else {
      changes.put(k, null);
    }
  }

  @Override
  public long commit() {
    checkUpdating("commit");
    long newVersion = version + 1;
    long t0 = System.nanoTime();
    commitSent = true;
    long written = provider.commitChanges(newVersion, changes);
    commitTimeMs = (System.nanoTime() - t0) / 1_000_000L;
    bytesWritten = written;
    provider.committed(this, newVersion);
    state = State.COMMITTED;
    changes.clear();
    undo.clear();
    return newVersion;
  }

  @Override
  public void abort() {
    if (state == State.UPDATING) {
      provider.aborted(this, commitSent);
    }
    state = State.ABORTED;
  }

  /** Restores the map to {@code version} (called by the provider, under its lock). */
  void rollback() {
    if (state != State.UPDATING) {
      return;
    }
    for (Map.Entry<UnsafeRow, UnsafeRow> e : undo.entrySet()) {
      if (e.getValue() == null) {
        map.remove(e.getKey());
      } else {
        map.put(e.getKey(), e.getValue());
      }
    }
    undo.clear();
    changes.clear();
    state = State.ABORTED;
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iterator(String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    return wrap(map.iterator());
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    return wrap(map.prefixScan(prefixKey));
  }

  @Override
  public StateStoreMetrics metrics() {
    Map<StateStoreCustomMetric, Object> custom = new HashMap<>();
    custom.put(SparkStateProvider.METRIC_COMMIT_TIME, commitTimeMs);
    custom.put(SparkStateProvider.METRIC_LOAD_TIME, loadTimeMs);
    custom.put(SparkStateProvider.METRIC_BYTES_WRITTEN, bytesWritten);
    custom.put(SparkStateProvider.METRIC_WORKER_RESTARTS, WorkerClient.threadRestarts() - restartsAtStart);
    return new StateStoreMetrics(map.size(), map.bytes(), immutableMap(custom), immutableMap(Collections.emptyMap()));
  }

  @Override
  public StateStoreCheckpointInfo getStateStoreCheckpointInfo() {
    return new StateStoreCheckpointInfo(provider.stateStoreId().partitionId(), version + 1,
        scala.Option.empty(), scala.Option.empty());
  }

  @Override
  public boolean hasCommitted() {
    return state == State.COMMITTED;
  }

  // ------------------------------------------------ unsupported: column families, multiple values

  @Override
  public void createColFamilyIfAbsent(String colFamilyName, StructType keySchema, StructType valueSchema,
      KeyStateEncoderSpec keyStateEncoderSpec, boolean useMultipleValuesPerKey, boolean isInternal) {
    provider.checkColumnFamily(colFamilyName);
    if (useMultipleValuesPerKey) {
      throw provider.multipleValuesUnsupported("createColFamilyIfAbsent(useMultipleValuesPerKey=true)");
    }
  }

  @Override
  public boolean removeColFamilyIfExists(String colFamilyName) {
    throw provider.columnFamiliesUnsupported("removeColFamilyIfExists(" + colFamilyName + ")");
  }

  @Override
  public void putList(UnsafeRow key, UnsafeRow[] values, String colFamilyName) {
    throw provider.multipleValuesUnsupported("putList");
  }

  @Override
  public void merge(UnsafeRow key, UnsafeRow value, String colFamilyName) {
    throw provider.multipleValuesUnsupported("merge");
  }

  @Override
  public void mergeList(UnsafeRow key, UnsafeRow[] values, String colFamilyName) {
    throw provider.multipleValuesUnsupported("mergeList");
  }

  @Override
  public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String colFamilyName) {
    throw provider.multipleValuesUnsupported("valuesIterator");
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow prefixKey, String colFamilyName) {
    throw provider.multipleValuesUnsupported("prefixScanWithMultiValues");
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String colFamilyName) {
    throw provider.multipleValuesUnsupported("iteratorWithMultiValues");
  }

  @Override
  public scala.collection.immutable.Set<String> allColumnFamilyNames() {
    return defaultFamilyOnly();
  }

  @Override
  public String toString() {
    return "SparkStateStore[" + provider.stateStoreId() + ", version=" + version + ", " + state + "]";
  }

  private void checkUpdating(String op) {
    if (state != State.UPDATING) {
      throw new IllegalStateException("spark_state: cannot " + op + " on " + this
          + ": the store was already committed or aborted");
    }
  }

  // ------------------------------------------------ Scala interop helpers

  static StateStoreIterator<UnsafeRowPair> wrap(Iterator<UnsafeRowPair> it) {
    return new StateStoreIterator<>(CollectionConverters.asScala(it), () -> BoxedUnit.UNIT);
  }

  static scala.collection.immutable.Set<String> defaultFamilyOnly() {
    return CollectionConverters.asScala(Collections.singleton(StateStore.DEFAULT_COL_FAMILY_NAME())).toSet();
  }

  @SuppressWarnings({"unchecked", "rawtypes"})
  static <K, V> scala.collection.immutable.Map<K, V> immutableMap(Map<K, V> m) {
    return (scala.collection.immutable.Map) scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(m));
  }
}
