package io.sparkstate.shim;

import io.sparkstate.shim.codec.ChangeLog;
import io.sparkstate.shim.engine.LocalStats;
import io.sparkstate.shim.engine.StateMap;
import io.sparkstate.shim.worker.ChangeStream;
import io.sparkstate.shim.worker.StoreClient;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreCheckpointInfo;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.TaskCompletionListener;

/**
 * The open (writable) store of one version: changes the provider's live rows in place and records
 * each change in a {@link ChangeLog}, so no copy of the rows is made per batch and commit ships only
 * the log. There is no undo log: an aborted store leaves the rows dirty and the provider drops them
 * ({@link SparkStateProvider#aborted}), so the next store reloads its version from the worker, where
 * every committed version is durable.
 */
final class SparkStateStore extends StoreView implements StateStore {
  private enum State { UPDATING, COMMITTED, ABORTED }

  private final ChangeLog changes;
  /** Where the log streams its chunks during the batch (null: a replayed store, nothing streams). */
  private final ChangeStream stream;
  private volatile State state = State.UPDATING;
  private boolean commitSent;

  // metrics of this store's batch
  private Metrics.Load load;
  private final LocalStats atStart;
  private final long restartsAtStart;
  private long commitTimeMs;
  private long bytesWritten;
  /** The commit id of the version this store committed (null before its commit). */
  private volatile String committedId;

  SparkStateStore(SparkStateProvider provider, StateVersion base, ChangeLog changes, ChangeStream stream,
      Metrics.Load load, long restartsAtStart) {
    super(provider, base);
    this.changes = changes;
    this.stream = stream;
    this.load = load;
    this.atStart = rows.stats();
    this.restartsAtStart = restartsAtStart;
    TaskContext ctx = TaskContext.get();
    if (ctx != null) {
      ctx.addTaskCompletionListener((TaskCompletionListener) c -> {
        if (state == State.UPDATING) {
          abort();
        }
        changes.close();
      });
    }
  }

  @Override
  public void put(UnsafeRow key, UnsafeRow value, String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    if (value == null) {
      throw new IllegalArgumentException("spark_state: cannot put a null value");
    }
    checkUpdating("put");
    changes.add(key, value, rows.put(key, value) == StateMap.CHANGED);
  }

  @Override
  public void remove(UnsafeRow key, String colFamilyName) {
    Unsupported.checkColumnFamily(colFamilyName, provider);
    checkUpdating("remove");
    int was = rows.remove(key);
    if (was != StateMap.ABSENT) {
      changes.add(key, null, was == StateMap.CHANGED);
    }
  }

  @Override
  public long commit() {
    checkUpdating("commit");
    long t0 = System.nanoTime();
    commitSent = true;
    StoreClient.Committed reply = provider.commit(this, changes, stream);
    bytesWritten = reply.bytes;
    committedId = reply.commitId;
    commitTimeMs = (System.nanoTime() - t0) / 1_000_000L;
    state = State.COMMITTED;
    return base.version + 1;
  }

  @Override
  public void abort() {
    if (state == State.UPDATING) {
      provider.aborted(this, commitSent);
    }
    state = State.ABORTED;
    changes.close();
  }

  /**
   * Marks the store aborted without touching its rows or log (called by the provider, under its lock,
   * on another task's thread, which drops the rows). Returns whether it was still updating.
   */
  boolean markAborted() {
    if (state != State.UPDATING) {
      return false;
    }
    state = State.ABORTED;
    return true;
  }

  @Override
  public StateStoreMetrics metrics() {
    Metrics.Load all;
    synchronized (this) {
      if (base.lateLoads != null) {
        rows.knownSize();   // a deferred restore's changes are read before their share is taken
        load = load.plus(base.lateLoads.drain());
      }
      all = load;
    }
    return Metrics.of(rows, atStart, commitTimeMs, all, bytesWritten,
        provider.workerRestarts() - restartsAtStart,
        provider.maintenanceFailures());
  }

  /**
   * Under checkpoint format v2 a version's checkpoint id is its commit id: the one this store committed, and
   * its base's (none for version 0). Spark's commit log records the id of the attempt that won, and the next
   * batch (or a restart) loads exactly that commit ({@code getStore(version, uniqueId)}).
   */
  @Override
  public StateStoreCheckpointInfo getStateStoreCheckpointInfo() {
    boolean ids = provider.checkpointIds();
    return new StateStoreCheckpointInfo(provider.stateStoreId().partitionId(), base.version + 1,
        scala.Option.apply(ids ? committedId : null), scala.Option.apply(ids ? base.commitId : null));
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
    Unsupported.checkColumnFamily(colFamilyName, provider);
    if (useMultipleValuesPerKey) {
      throw Unsupported.multipleValues("createColFamilyIfAbsent(useMultipleValuesPerKey=true)", provider);
    }
  }

  @Override
  public boolean removeColFamilyIfExists(String colFamilyName) {
    throw Unsupported.columnFamilies("removeColFamilyIfExists(" + colFamilyName + ")", provider);
  }

  public void putList(UnsafeRow key, UnsafeRow[] values, String colFamilyName) {
    throw Unsupported.multipleValues("putList", provider);
  }

  @Override
  public void merge(UnsafeRow key, UnsafeRow value, String colFamilyName) {
    throw Unsupported.multipleValues("merge", provider);
  }

  public void mergeList(UnsafeRow key, UnsafeRow[] values, String colFamilyName) {
    throw Unsupported.multipleValues("mergeList", provider);
  }

  @Override
  public String toString() {
    return "SparkStateStore[" + provider.stateStoreId() + ", version=" + base.version + ", " + state + "]";
  }

  private void checkUpdating(String op) {
    if (state != State.UPDATING) {
      throw new IllegalStateException("spark_state: cannot " + op + " on " + this
          + ": the store was already committed or aborted");
    }
  }
}
