package io.sparkstate.shim;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Arrays;
import java.util.Collections;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.locks.ReentrantReadWriteLock;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateSchemaProvider;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomSumMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomTimingMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * spark_state's {@link StateStoreProvider}: the live version of one (operator, partition, store)
 * is a map in this JVM; commits ship their changes to the executor's Python worker, which owns
 * storage; versions the JVM does not hold are loaded from the worker.
 *
 * <p>Enable with {@code spark.sql.streaming.stateStore.providerClass=io.sparkstate.shim.SparkStateProvider}.
 */
public class SparkStateProvider implements StateStoreProvider {
  public static final String OPTION_PREFIX = "spark.sql.streaming.stateStore.sparkState.";
  static final int DEFAULT_MAX_PARALLELISM = 100_800;
  private static final Logger LOG = LoggerFactory.getLogger(SparkStateProvider.class);

  static final StateStoreCustomMetric METRIC_COMMIT_TIME = new StateStoreCustomTimingMetric(
      "sparkStateCommitTimeMs", "spark_state: time to ship a commit to the worker and have it made durable");
  static final StateStoreCustomMetric METRIC_LOAD_TIME = new StateStoreCustomTimingMetric(
      "sparkStateLoadTimeMs", "spark_state: time to load a version from the worker");
  static final StateStoreCustomMetric METRIC_BYTES_WRITTEN = new StateStoreCustomSumMetric(
      "sparkStateBytesWritten", "spark_state: bytes written to checkpoint storage by commits");
  static final StateStoreCustomMetric METRIC_WORKER_RESTARTS = new StateStoreCustomSumMetric(
      "sparkStateWorkerRestarts", "spark_state: state worker restarts seen during the batch");
  static final StateStoreCustomMetric METRIC_MAINTENANCE_FAILURES = new StateStoreCustomSumMetric(
      MaintenanceWarnings.METRIC, "spark_state: consecutive failed background maintenance runs of the stores");
  /** Spark's local property with the running query's id (StreamExecution sets it on every task). */
  static final String QUERY_ID_PROPERTY = "sql.streaming.queryId";

  /** Option sets already validated by the worker in this JVM (validate once per distinct set). */
  private static final Set<Map<String, String>> VALIDATED = ConcurrentHashMap.newKeySet();

  // StateStoreProvider trait fields
  private ReentrantReadWriteLock maintenanceLock;
  private volatile boolean unloaded;

  private StateStoreId stateStoreId;
  private StructType keySchema;
  private StructType valueSchema;
  private int numColsPrefixKey;
  private StateStoreConf storeConf;
  private Configuration hadoopConf;
  private Map<String, String> options = Collections.emptyMap();
  private KeyHasher hasher;
  /** Typed rows for this store's schemas; null when Spark's Arrow conversion cannot map them (opaque rows). */
  private TypedCodec typed;
  /** The store's identity as requests send it; replaced whole (never mutated) so readers need no lock. */
  private volatile ObjectNode storeNode;

  /**
   * The version this provider holds, or null before the first load and after an abort (an aborted
   * store leaves its map dirty; the next store reloads). Guarded by {@code this}.
   */
  private StateMap live;
  /** Keys changed by the last committed batch: sizes the next change log. Guarded by {@code this}. */
  private long lastChanges;
  /** The store opened by getStore and not yet committed or aborted. Guarded by {@code this}. */
  private SparkStateStore open;
  /** Time spent loading {@link #live} not yet reported by a store's metrics. Guarded by {@code this}. */
  private long unreportedLoadMs;
  /** The version this provider last loaded or committed (-1: none); maintenance retains around it. */
  private volatile long heldVersion = -1;
  /** Consecutive failed maintenance runs of this store as the worker last reported them, and the error. */
  private volatile long maintenanceFailures;
  private volatile String maintenanceError;

  public SparkStateProvider() {
    StateStoreProvider.$init$(this);
  }

  // ------------------------------------------------------------------ trait fields
  // Members only some Spark versions declare carry no @Override (see SparkCompat).
  // Spark 4.3: the StateStoreProvider trait fields maintenanceLock and unloaded.

  public void org$apache$spark$sql$execution$streaming$state$StateStoreProvider$_setter_$maintenanceLock_$eq(
      ReentrantReadWriteLock lock) {
    this.maintenanceLock = lock;
  }

  public ReentrantReadWriteLock maintenanceLock() {
    return maintenanceLock;
  }

  public boolean unloaded() {
    return unloaded;
  }

  public void unloaded_$eq(boolean value) {
    this.unloaded = value;
  }

  // ------------------------------------------------------------------ init

  @Override
  public void init(StateStoreId stateStoreId, StructType keySchema, StructType valueSchema,
      KeyStateEncoderSpec keyStateEncoderSpec, boolean useColumnFamilies, StateStoreConf storeConf,
      Configuration hadoopConf, boolean useMultipleValuesPerKey, Option<StateSchemaProvider> stateSchemaProvider) {
    this.stateStoreId = stateStoreId;
    this.keySchema = keySchema;
    this.valueSchema = valueSchema;
    this.storeConf = storeConf;
    this.hadoopConf = hadoopConf;
    if (useColumnFamilies) {
      throw columnFamiliesUnsupported("a store with useColumnFamilies=true");
    }
    if (useMultipleValuesPerKey) {
      throw multipleValuesUnsupported("a store with useMultipleValuesPerKey=true");
    }
    if (storeConf.enableStateStoreCheckpointIds()) {
      throw new UnsupportedOperationException("spark_state: " + this + " does not support "
          + "spark.sql.streaming.stateStore.checkpointFormatVersion > 1 (state store checkpoint ids); "
          + "set it to 1.");
    }
    if (keyStateEncoderSpec instanceof PrefixKeyScanStateEncoderSpec) {
      this.numColsPrefixKey = ((PrefixKeyScanStateEncoderSpec) keyStateEncoderSpec).numColsPrefixKey();
    } else if (keyStateEncoderSpec instanceof NoPrefixKeyStateEncoderSpec) {
      this.numColsPrefixKey = 0;
    } else {
      throw new UnsupportedOperationException("spark_state: " + this + " does not support the key encoder "
          + keyStateEncoderSpec + " (range scans); spark_state supports plain and prefix-scan keys.");
    }

    Map<String, String> opts = new TreeMap<>();
    for (Map.Entry<String, String> e : CollectionConverters.asJava(storeConf.sqlConfs()).entrySet()) {
      if (e.getKey().startsWith(OPTION_PREFIX)) {
        opts.put(e.getKey().substring(OPTION_PREFIX.length()), e.getValue());
      }
    }
    this.options = Collections.unmodifiableMap(opts);

    int maxParallelism = DEFAULT_MAX_PARALLELISM;
    String mp = opts.get("maxParallelism");
    if (mp != null) {
      try {
        maxParallelism = Integer.parseInt(mp.trim());
      } catch (NumberFormatException e) {
        maxParallelism = -1; // validate below reports it
      }
    }
    validateOptions();
    if (maxParallelism <= 0) {
      throw new IllegalArgumentException("spark_state: " + OPTION_PREFIX + "maxParallelism=" + mp
          + " is not a positive whole number.");
    }
    this.hasher = new KeyHasher(keySchema,
        KeyHasher.hashFieldCount(keySchema, numColsPrefixKey, stateStoreId.storeName()), maxParallelism);

    this.typed = TypedCodec.forSchemas(keySchema, valueSchema);
    if (typed == null) {
      LOG.info("spark_state: {} keeps opaque rows (file format 1): Spark's Arrow conversion cannot map its key "
          + "schema {} or value schema {}", this, keySchema.simpleString(), valueSchema.simpleString());
    }

    createStoreDirectory();

    ObjectNode store = WorkerClient.header("store");
    store.remove("op");
    store.put("sparkRoot", stateStoreId.checkpointRootLocation());
    store.put("location", stateStoreId.storeCheckpointLocation().toUri().toString());
    store.put("operator", stateStoreId.operatorId());
    store.put("partition", stateStoreId.partitionId());
    store.put("name", stateStoreId.storeName());
    this.storeNode = store;
  }

  /**
   * Creates Spark's directory of this store, as Spark's own providers do: Spark's readers of the
   * checkpoint (the statestore data source) find partitions by listing these directories, whatever
   * storage the worker uses.
   */
  private void createStoreDirectory() {
    org.apache.hadoop.fs.Path dir = stateStoreId.storeCheckpointLocation();
    try {
      dir.getFileSystem(hadoopConf).mkdirs(dir);
    } catch (IOException | RuntimeException e) {
      LOG.warn("spark_state: cannot create {} (Spark's readers of the checkpoint may miss this partition): {}",
          dir, e.toString());
    }
  }

  private void validateOptions() {
    if (VALIDATED.contains(options)) {
      return;
    }
    ObjectNode h = WorkerClient.header("validate");
    h.set("options", WorkerClient.optionsNode(options));
    WorkerClient.get().call(h, null, options);
    VALIDATED.add(options);
  }

  @Override
  public StateStoreId stateStoreId() {
    return stateStoreId;
  }

  // ------------------------------------------------------------------ stores

  /** Spark 4.0 and 4.1. */
  public StateStore getStore(long version, Option<String> uniqueId) {
    return getStore(version, uniqueId, false, false);
  }

  /** Spark 4.2 and 4.3. */
  public synchronized StateStore getStore(long version, Option<String> uniqueId, boolean forceSnapshotOnCommit,
      boolean loadEmpty) {
    if (version < 0) {
      throw new IllegalArgumentException("spark_state: cannot get version " + version + " of " + this);
    }
    if (uniqueId.isDefined()) {
      throw new UnsupportedOperationException("spark_state: " + this + " does not support state store "
          + "checkpoint ids (checkpointFormatVersion > 1)");
    }
    if (loadEmpty) {
      throw new UnsupportedOperationException("spark_state: " + this + " does not support getStore(loadEmpty=true)");
    }
    if (open != null) {
      if (open.markAborted()) {
        LOG.warn("spark_state: {} was left open (task retry?); dropping its map before opening version {}",
            open, version);
        dropIfLive(open.map());
      }
      open = null;
    }
    long restarts = WorkerClient.threadRestarts();
    noteQueryId();
    if (live == null || live.version != version || !confirmed(live)) {
      loadLive(version);
    }
    open = new SparkStateStore(this, live, version, unreportedLoadMs, restarts, lastChanges);
    unreportedLoadMs = 0;
    return open;
  }

  @Override
  public synchronized ReadStateStore getReadStore(long version, Option<String> uniqueId) {
    if (version < 0) {
      throw new IllegalArgumentException("spark_state: cannot read version " + version + " of " + this);
    }
    if (uniqueId.isDefined()) {
      throw new UnsupportedOperationException("spark_state: " + this + " does not support state store "
          + "checkpoint ids (checkpointFormatVersion > 1)");
    }
    noteQueryId();
    if (open == null) {
      if (live == null || live.version != version || !confirmed(live)) {
        loadLive(version);
      }
      return new SparkStateReadStore(this, live, version);
    }
    // A write store is open: read a private copy so it cannot see uncommitted changes.
    return new SparkStateReadStore(this, loadMap(version, null), version);
  }

  private void loadLive(long version) {
    long t0 = System.nanoTime();
    live = null;
    live = loadMap(version, null);
    heldVersion = version;
    unreportedLoadMs += (System.nanoTime() - t0) / 1_000_000L;
  }

  /**
   * Whether storage still holds the very commit {@code map} was built from. Another attempt of a task
   * (a retry on another executor, a speculative copy) may have re-committed that version since: then
   * this map is stale and must be reloaded, or the next commit would build on state nobody has.
   */
  private boolean confirmed(StateMap map) {
    if (map.version == 0 || map.commitId == null) {
      return map.version == 0;
    }
    return loadMap(map.version, map.commitId) == null;
  }

  /** The running query's id, from the task's local properties: the store's identity includes it. */
  private void noteQueryId() {
    TaskContext ctx = TaskContext.get();
    String queryId = ctx == null ? null : ctx.getLocalProperty(QUERY_ID_PROPERTY);
    if (queryId != null && !queryId.equals(storeNode.path("queryId").asText(null))) {
      ObjectNode node = storeNode.deepCopy();
      node.put("queryId", queryId);
      storeNode = node;
    }
  }

  /**
   * Loads {@code version} from the worker into a new map (version 0 is empty without asking). With
   * {@code knownCommitId}, returns null instead when storage still holds that commit.
   */
  private StateMap loadMap(long version, String knownCommitId) {
    if (version == 0) {
      return newMap(0, 0);
    }
    ObjectNode h = request("load");
    h.put("version", version);
    if (knownCommitId != null) {
      h.put("commitId", knownCommitId);
    }
    long t0 = System.nanoTime();
    StateMap map = WorkerClient.get().call(h, null, options, (JsonNode reply, java.io.InputStream body) -> {
      if (reply.path("unchanged").asBoolean(false)) {
        return null;
      }
      StateMap m = newMap(version, reply.path("rows").asLong(0));
      m.commitId = reply.path("commitId").asText(null);
      m.opaque = !ArrowCodec.decodeState(body, keySchema, valueSchema, m::load);
      return m;
    });
    if (map != null) {
      LOG.info("spark_state: loaded version {} of {} ({} keys) in {} ms", version, stateStoreId, map.size(),
          (System.nanoTime() - t0) / 1_000_000L);
    }
    return map;
  }

  private StateMap newMap(long version, long expectedRows) {
    return new StateMap(version, numColsPrefixKey > 0 ? new PrefixIndex(keySchema, numColsPrefixKey) : null,
        expectedRows, keySchema.fields().length, valueSchema.fields().length);
  }

  /** The codec of typed rows, or null when this provider ships opaque rows (file format 1). */
  TypedCodec typedCodec() {
    return typed;
  }

  KeyHasher hasher() {
    return hasher;
  }

  /**
   * Ships a change map (key to new value, null = delete), or the whole map (see {@link #isFull}), as
   * version {@code newVersion}, built on the commit {@code map} holds (the worker refuses it if storage
   * holds another); returns the reply (bytes written, the new commit id).
   */
  JsonNode commitChanges(StateMap map, long newVersion, Map<UnsafeRow, UnsafeRow> changes) {
    boolean full = isFull(map);
    ArrowCodec.Body body;
    try {
      if (typed == null) {
        body = ArrowCodec.encodeChanges(full ? map.asMap() : changes, hasher);
      } else if (full) {
        body = typed.encode(map.asMap().entrySet().iterator(), map.size(), hasher);
      } else {
        body = typed.encode(changes.entrySet().iterator(), changes.size(), hasher);
      }
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot encode the changes of " + this, e);
    }
    return sendCommit(map, newVersion, body, full, false);
  }

  /**
   * Ships a typed change log encoded during the batch (null: no changes); {@code repeatedKeys}: it
   * may name a key more than once (the worker keeps the last row). A map to ship whole ignores the log.
   */
  JsonNode commitLog(StateMap map, long newVersion, TypedCodec.Encoder log, boolean repeatedKeys) {
    boolean full = isFull(map);
    ArrowCodec.Body body;
    try {
      if (full || log == null) {
        if (log != null) {
          log.close();
        }
        body = full ? typed.encode(map.asMap().entrySet().iterator(), map.size(), hasher)
            : typed.encode(java.util.Collections.emptyIterator(), 0, hasher);
      } else {
        body = log.finish();
      }
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot encode the changes of " + this, e);
    }
    return sendCommit(map, newVersion, body, full, repeatedKeys && !full);
  }

  /**
   * A map whose files are in the other format than this provider writes (opaque files and a typed codec, or
   * typed files and no codec: executors that disagree) changes format by shipping it whole once (the map
   * already holds the changes).
   */
  private boolean isFull(StateMap map) {
    return (typed != null) == map.opaque;
  }

  private JsonNode sendCommit(StateMap map, long newVersion, ArrowCodec.Body body, boolean full, boolean repeatedKeys) {
    ObjectNode h = request("commit");
    if (full) {
      h.put("full", true);
    }
    if (repeatedKeys) {
      h.put("repeatedKeys", true);
    }
    h.put("version", newVersion);
    h.put("baseCommitId", map.commitId);
    h.put("minVersionsToRetain", storeConf.minVersionsToRetain());
    JsonNode reply = WorkerClient.get().call(h, body, options);
    SparkCompat.reportCommitIfValidating(storeConf, newVersion, stateStoreId, hadoopConf);
    noteMaintenance(reply);
    return reply;
  }

  synchronized void committed(SparkStateStore store, long newVersion, String commitId, long changes) {
    store.map().version = newVersion;
    store.map().commitId = commitId;
    store.map().opaque = typed == null;
    heldVersion = newVersion;
    lastChanges = changes;
    if (open == store) {
      open = null;
    }
  }

  /** Records the worker's maintenance status of this store; a new failure is logged once. */
  private void noteMaintenance(JsonNode reply) {
    long failures = reply.path("maintenanceFailures").asLong(0);
    String error = reply.path("maintenanceError").asText(null);
    if (failures > 0 && error != null && !error.equals(maintenanceError)) {
      LOG.warn("spark_state: maintenance of {} failed ({} run(s) in a row): {}", stateStoreId, failures, error);
    }
    maintenanceFailures = failures;
    maintenanceError = failures > 0 ? error : null;
  }

  long maintenanceFailures() {
    return maintenanceFailures;
  }

  /** The store's map holds uncommitted changes: drop it, the next store reloads its version. */
  synchronized void aborted(SparkStateStore store, boolean commitSent) {
    store.markAborted();
    dropIfLive(store.map());
    if (open == store) {
      open = null;
    }
    if (commitSent) {
      // The worker may hold part of version+1: tell it to drop it (best effort).
      try {
        ObjectNode h = request("abort");
        h.put("version", store.version() + 1);
        WorkerClient.get().call(h, null, options);
      } catch (RuntimeException e) {
        LOG.warn("spark_state: abort of version {} of {} failed: {}", store.version() + 1, stateStoreId, e.toString());
      }
    }
  }

  /** Forgets the live map if it is {@code map} (dirty: changed by a store that did not commit). */
  private void dropIfLive(StateMap map) {
    if (live == map) {
      live = null;
    }
  }

  private ObjectNode request(String op) {
    ObjectNode h = WorkerClient.header(op);
    h.set("store", storeNode.deepCopy());
    h.set("options", WorkerClient.optionsNode(options));
    return h;
  }

  // ------------------------------------------------------------------ maintenance, close, metrics

  @Override
  public void doMaintenance() {
    long version = heldVersion;
    if (storeNode == null || version < 1) {
      return;   // nothing loaded or committed here: nothing to retain around
    }
    try {
      ObjectNode h = request("maintenance");
      h.put("minVersionsToRetain", storeConf.minVersionsToRetain());
      h.put("version", version);
      noteMaintenance(WorkerClient.get().call(h, null, options));
    } catch (RuntimeException e) {
      LOG.warn("spark_state: maintenance of {} failed: {}", stateStoreId, e.toString());
    }
  }

  public void doCleanupMaintenance() {
    doMaintenance();
  }

  public void doSnapshotMaintenance() {
    // Snapshots are compacted by the worker in the background; cleanup triggers it.
  }

  @Override
  public synchronized void close() {
    if (open != null) {
      open.markAborted();
      open = null;
    }
    live = null;
  }

  @Override
  public scala.collection.immutable.Seq<StateStoreCustomMetric> supportedCustomMetrics() {
    return CollectionConverters.asScala(Arrays.asList(
        METRIC_COMMIT_TIME, METRIC_LOAD_TIME, METRIC_BYTES_WRITTEN, METRIC_WORKER_RESTARTS,
        METRIC_MAINTENANCE_FAILURES)).toList();
  }

  // ------------------------------------------------------------------ errors

  void checkColumnFamily(String name) {
    if (name != null && !StateStore.DEFAULT_COL_FAMILY_NAME().equals(name)) {
      throw columnFamiliesUnsupported("column family '" + name + "'");
    }
  }

  UnsupportedOperationException columnFamiliesUnsupported(String what) {
    return new UnsupportedOperationException("spark_state: " + what + " is not supported by "
        + this + ": spark_state supports single-value stores in the default column family only "
        + "(like Spark's HDFSBackedStateStoreProvider). Multiple column families are used by "
        + "transformWithState / transformWithStateInPandas; run those with "
        + "spark.sql.streaming.stateStore.providerClass="
        + "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider.");
  }

  UnsupportedOperationException multipleValuesUnsupported(String what) {
    return new UnsupportedOperationException("spark_state: " + what + " (multiple values per key) is not "
        + "supported by " + this + ": spark_state supports single-value stores in the default column "
        + "family only (like Spark's HDFSBackedStateStoreProvider). Multiple values per key are used by "
        + "transformWithState / transformWithStateInPandas (ListState); run those with "
        + "spark.sql.streaming.stateStore.providerClass="
        + "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider.");
  }

  @Override
  public String toString() {
    return stateStoreId == null ? "SparkStateProvider[uninitialized]"
        : "SparkStateProvider[operator=" + stateStoreId.operatorId() + ", partition=" + stateStoreId.partitionId()
            + ", store=" + stateStoreId.storeName() + ", checkpoint=" + stateStoreId.checkpointRootLocation() + "]";
  }
}
