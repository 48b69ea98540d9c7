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
 * change log (key → new value, null = delete) for commit, so no copy of the map is made per batch.
 * With typed rows the change log is an Arrow stream each put and remove is appended to as it
 * happens (as HDFS's provider writes its delta file during the batch), so commit only finishes and
 * ships it; a key changed twice is then in it twice and the commit says so (the worker keeps the
 * last row). Opaque rows (format 1) keep a map of the changed rows, encoded at commit.
 * There is no undo log: an aborted store leaves the live map dirty and the provider drops it
 * ({@link SparkStateProvider#aborted}), so the next store reloads its version from the worker,
 * where every committed version is durable. A delete in the change log may name a key that was
 * absent at {@code version} (put and removed in this batch); the worker drops deletes of unknown
 * keys.
 */
final class SparkStateStore implements StateStore {
  private enum State { UPDATING, COMMITTED, ABORTED }

  private final SparkStateProvider provider;
  private final StateMap map;
  private final long version;
  /** Typed rows: the change log, encoded as the batch runs (null until the first change). */
  private TypedCodec.Encoder log;
  private KeyFingerprints changedKeys;
  private final long expectedChanges;
  /** Opaque rows: the change log. Linked: commit encodes in insertion (= allocation) order, kinder to caches. */
  private final LinkedHashMap<UnsafeRow, UnsafeRow> changes;
  private volatile State state = State.UPDATING;
  private boolean commitSent;

  // metrics of this store's batch
  private final long loadTimeMs;
  private final long restartsAtStart;
  private long commitTimeMs;
  private long bytesWritten;

  /**
   * Sizing hint for the change log: at most this many rows, so one huge batch does not make every
   * following batch allocate for its size (the log grows past it when needed).
   */
  private static final long MAX_EXPECTED_CHANGES = 1 << 20;

  /** {@code expectedChanges}: a guess of the batch's changed keys (sizes the change log). */
  SparkStateStore(SparkStateProvider provider, StateMap map, long version, long loadTimeMs, long restartsAtStart,
      long expectedChanges) {
    this.provider = provider;
    this.map = map;
    this.version = version;
    this.expectedChanges = Math.min(expectedChanges, MAX_EXPECTED_CHANGES);
    // -Dspark_state.encodeAtCommit: typed rows too keep a map encoded at commit (benchmarks A/B)
    boolean logAsItHappens = provider.typedCodec() != null && !Boolean.getBoolean("spark_state.encodeAtCommit");
    this.changes = logAsItHappens ? null
        : new LinkedHashMap<>((int) Math.max(16, Math.min(expectedChanges * 4 / 3 + 1, 1 << 29)));
    this.loadTimeMs = loadTimeMs;
    this.restartsAtStart = restartsAtStart;
    TaskContext ctx = TaskContext.get();
    if (ctx != null) {
      ctx.addTaskCompletionListener((TaskCompletionListener) c -> {
        if (state == State.UPDATING) {
          abort();
        }
        closeLog();
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
    // The arena copies the bytes and a typed change log encodes them at once: only a map or change
    // map that keeps the row objects needs copies (Spark reuses its rows' buffers).
    boolean keep = changes != null || !map.copiesRows();
    UnsafeRow k = keep ? key.copy() : key;
    UnsafeRow v = keep ? value.copy() : value;
    map.put(k, v);
    logChange(k, v);
  }

  @Override
  public void remove(UnsafeRow key, String colFamilyName) {
    provider.checkColumnFamily(colFamilyName);
    checkUpdating("remove");
    if (map.remove(key) != null) {
      logChange(changes == null ? key : key.copy(), null);
    }
  }

  private void logChange(UnsafeRow key, UnsafeRow value) {
    if (changes != null) {
      changes.put(key, value);
      return;
    }
    try {
      if (log == null) {
        log = provider.typedCodec().newEncoder((int) Math.min(expectedChanges, Integer.MAX_VALUE), provider.hasher());
        changedKeys = new KeyFingerprints(expectedChanges);
      }
      changedKeys.add(log.add(key, value), key);
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException("spark_state: cannot encode a change of " + this, e);
    }
  }

  @Override
  public long commit() {
    checkUpdating("commit");
    long newVersion = version + 1;
    long t0 = System.nanoTime();
    commitSent = true;
    long changed = changes != null ? changes.size() : log == null ? 0 : log.rows();
    com.fasterxml.jackson.databind.JsonNode reply = changes != null
        ? provider.commitChanges(map, newVersion, changes)
        : provider.commitLog(map, newVersion, log, changedKeys != null && changedKeys.repeated());
    log = null;
    changedKeys = null;
    commitTimeMs = (System.nanoTime() - t0) / 1_000_000L;
    bytesWritten = reply.path("bytes").asLong(0);
    provider.committed(this, newVersion, reply.path("commitId").asText(null), changed);
    state = State.COMMITTED;
    if (changes != null) {
      changes.clear();
    }
    return newVersion;
  }

  @Override
  public void abort() {
    if (state == State.UPDATING) {
      provider.aborted(this, commitSent);
    }
    state = State.ABORTED;
    closeLog();
  }

  /**
   * Marks the store aborted without touching its map (called by the provider, under its lock,
   * which drops the map). Returns whether it was still updating.
   */
  boolean markAborted() {
    if (state != State.UPDATING) {
      return false;
    }
    state = State.ABORTED;
    return true;
  }

  /**
   * Frees the change log's Arrow memory (an aborted or failed batch). Only on the task's thread (abort,
   * task completion): {@link #markAborted} runs on another task's thread while this one may still append.
   */
  private void closeLog() {
    if (log != null) {
      log.close();
      log = null;
      changedKeys = null;
    }
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
    custom.put(SparkStateProvider.METRIC_MAINTENANCE_FAILURES, provider.maintenanceFailures());
    return SparkCompat.metrics(map.size(), map.bytes(), immutableMap(custom));
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
  // (no @Override where Spark 4.0/4.1 lacks the member; see SparkCompat)

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

  public void putList(UnsafeRow key, UnsafeRow[] values, String colFamilyName) {
    throw provider.multipleValuesUnsupported("putList");
  }

  @Override
  public void merge(UnsafeRow key, UnsafeRow value, String colFamilyName) {
    throw provider.multipleValuesUnsupported("merge");
  }

  public void mergeList(UnsafeRow key, UnsafeRow[] values, String colFamilyName) {
    throw provider.multipleValuesUnsupported("mergeList");
  }

  @Override
  public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String colFamilyName) {
    throw provider.multipleValuesUnsupported("valuesIterator");
  }

  public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow prefixKey, String colFamilyName) {
    throw provider.multipleValuesUnsupported("prefixScanWithMultiValues");
  }

  public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String colFamilyName) {
    throw provider.multipleValuesUnsupported("iteratorWithMultiValues");
  }

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
