package io.sparkstate.shim;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.util.Iterator;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.locks.ReentrantReadWriteLock;

import io.sparkstate.shim.codec.ArrowCodec;
import io.sparkstate.shim.codec.ChangeLog;
import io.sparkstate.shim.codec.KeyHasher;
import io.sparkstate.shim.codec.RowFormat;
import io.sparkstate.shim.engine.DeferredRestore;
import io.sparkstate.shim.engine.Engine;
import io.sparkstate.shim.engine.KeyOrder;
import io.sparkstate.shim.engine.RangeReader;
import io.sparkstate.shim.engine.RemoteImage;
import io.sparkstate.shim.engine.Restore;
import io.sparkstate.shim.engine.RowImageException;
import io.sparkstate.shim.engine.StateMap;
import io.sparkstate.shim.engine.StoreSpec;
import io.sparkstate.shim.worker.ChangeStream;
import io.sparkstate.shim.worker.Options;
import io.sparkstate.shim.worker.StoreClient;
import io.sparkstate.shim.worker.WorkerClient;
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
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.SupportsFineGrainedReplay;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.NextIterator;
import org.apache.spark.util.TaskCompletionListener;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Enumeration;
import scala.Option;
import scala.Tuple4;
import scala.jdk.javaapi.CollectionConverters;

/**
 * spark_state's {@link StateStoreProvider}: the live version of one (operator, partition, store)
 * is held in this JVM ({@link StateVersion}); commits ship their changes to the executor's Python
 * worker, which owns storage ({@link StoreClient}); versions the JVM does not hold are loaded from
 * the worker.
 *
 * <p>Enable with {@code spark.sql.streaming.stateStore.providerClass=io.sparkstate.shim.SparkStateProvider}.
 */
public class SparkStateProvider implements StateStoreProvider, SupportsFineGrainedReplay {
  private static final Logger LOG = LoggerFactory.getLogger(SparkStateProvider.class);
  /** Spark's local property with the running query's id (StreamExecution sets it on every task). */
  static final String QUERY_ID_PROPERTY = "sql.streaming.queryId";
  /**
   * Most changes a change log is sized for: one huge batch does not make every following batch
   * allocate for its size (a log grows past it when needed).
   */
  private static final long MAX_EXPECTED_CHANGES = 1 << 20;
  /** Spark 4.1+'s row checksums of its own providers (spark_state's files carry CRCs of their own). */
  private static final String ROW_CHECKSUM_CONF = "spark.sql.streaming.stateStore.rowChecksum.enabled";
  private static final java.util.concurrent.atomic.AtomicBoolean ROW_CHECKSUM_NOTED =
      new java.util.concurrent.atomic.AtomicBoolean();

  // StateStoreProvider trait fields
  private ReentrantReadWriteLock maintenanceLock;
  private volatile boolean unloaded;

  private StateStoreId stateStoreId;
  private StructType keySchema;
  private StructType valueSchema;
  private int numColsPrefixKey;
  private StateStoreConf storeConf;
  private Configuration hadoopConf;
  private RowFormat format;
  private KeyHasher hasher;
  /**
   * Spark names versions by checkpoint id (checkpoint format v2): each commit's id is its commit id, and
   * getStore(v, id) loads that very commit of v (docs/consistency.md, rule 7).
   */
  private boolean checkpointIds;
  /** What the local tier knows of this store. */
  private StoreSpec spec;
  private volatile StoreClient client;
  /**
   * Stores (by {@link StateStoreId}) whose row image failed a read in this executor (corrupt,
   * unreadable): their loads read whole rows from then on, as an image is only a cache of what the
   * checkpoint's snapshot holds, and a task retried here must not meet the same damage again. Keyed by
   * the StateStoreId itself (its equality covers the checkpoint root), never by its toString(), which
   * Spark prints without the checkpoint: keyed so, one damaged image turned row images off for the same
   * operator and partition of every other query of the executor.
   */
  private static final Set<StateStoreId> IMAGES_FAILED = ConcurrentHashMap.newKeySet();

  /**
   * The version this provider holds, or null before the first load and after an abort (an aborted
   * store leaves its rows dirty; the next store reloads). Guarded by {@code this}.
   */
  private StateVersion live;
  /** Changes of the last committed batch: sizes the next change log. Guarded by {@code this}. */
  private long lastChanges;
  /** The store opened by getStore and not yet committed or aborted. Guarded by {@code this}. */
  private SparkStateStore open;
  /** Read stores sharing {@link #live}'s rows, not yet released. Guarded by {@code this}. */
  private int liveReaders;
  /**
   * Spark closed (unloaded) this provider; {@link #live} is closed as soon as no store uses it. Guarded by
   * {@code this}.
   */
  private boolean closed;
  /** What loading {@link #live} cost, not yet reported by a store's metrics. Guarded by {@code this}. */
  private Metrics.Load unreportedLoad = Metrics.Load.NONE;
  /** The version this provider last loaded or committed (-1: none); maintenance retains around it. */
  private volatile long heldVersion = -1;
  /** The worker's maintenance status of this store, as it last reported it. */
  private volatile StoreClient.Maintenance maintenance;
  /** Spark's directory of this store exists ({@link #createStoreDirectory}). */
  private volatile boolean storeDirectoryMade;

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
      throw Unsupported.columnFamilies("a store with useColumnFamilies=true", this);
    }
    if (useMultipleValuesPerKey) {
      throw Unsupported.multipleValues("a store with useMultipleValuesPerKey=true", this);
    }
    this.checkpointIds = storeConf.enableStateStoreCheckpointIds();
    if (keyStateEncoderSpec instanceof PrefixKeyScanStateEncoderSpec) {
      this.numColsPrefixKey = ((PrefixKeyScanStateEncoderSpec) keyStateEncoderSpec).numColsPrefixKey();
    } else if (keyStateEncoderSpec instanceof NoPrefixKeyStateEncoderSpec) {
      this.numColsPrefixKey = 0;
    } else {
      throw Unsupported.rangeScans(this, keyStateEncoderSpec);
    }

    java.util.Map<String, String> confs = CollectionConverters.asJava(storeConf.sqlConfs());
    if ("true".equalsIgnoreCase(confs.get(ROW_CHECKSUM_CONF)) && ROW_CHECKSUM_NOTED.compareAndSet(false, true)) {
      LOG.info("spark_state: {}=true is a setting of Spark's own providers; spark_state checks every state file it "
          + "reads by the CRC-32 of each file, record batch and row-image block instead (docs/configuration.md, "
          + "\"Checksums: what covers what\")", ROW_CHECKSUM_CONF);
    }
    Options options = Options.from(confs);
    WorkerClient worker = WorkerClient.get();
    Engine.executor().budget().setLimit(StoreClient.validate(worker, options));
    Engine.executor().setImageCacheSize(StoreClient.imageCacheSize(worker, options));
    this.hasher = KeyHasher.of(keySchema,
        KeyHasher.hashFieldCount(keySchema, numColsPrefixKey, stateStoreId.storeName()), options.maxParallelism());
    this.format = rowFormat(keySchema, valueSchema, hasher);
    hasher.prepare();
    if (format.typed()) {
      ArrowCodec.prepareDecoding(keySchema, valueSchema);
    }
    this.spec = new StoreSpec(keySchema, valueSchema.fields().length, numColsPrefixKey,
        KeyOrder.of(hasher::hash, hasher::keyGroup),
        this::imageFailed);
    if (!format.typed()) {
      LOG.info("spark_state: {} keeps opaque rows (file format 1): Spark's Arrow conversion cannot map its key "
          + "schema {} or value schema {}", this, keySchema.simpleString(), valueSchema.simpleString());
    }
    this.client = new StoreClient(worker, stateStoreId, options, checkpointIds);
  }

  /**
   * The format this provider's rows travel in ({@link RowFormat#of}). Package-private so that the
   * benchmarks' A/B providers (benchmarks/jvm/VariantProviders.java) can pick another.
   */
  RowFormat rowFormat(StructType keySchema, StructType valueSchema, KeyHasher hasher) {
    return RowFormat.of(keySchema, valueSchema, hasher);
  }

  /**
   * Creates Spark's directory of this store, as Spark's own providers do: Spark's readers of the
   * checkpoint (the statestore data source) find partitions by listing these directories, whatever
   * storage the worker uses. Done before the provider's first commit, as Spark's RocksDB provider does, not
   * in {@link #init}: on object storage a mkdirs costs requests, which a restore's getStore need not wait for.
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
    checkVersion(version, uniqueId);
    if (loadEmpty) {
      throw new UnsupportedOperationException("spark_state: " + this + " does not support getStore(loadEmpty=true)");
    }
    if (open != null) {
      if (open.markAborted()) {
        LOG.warn("spark_state: {} was left open (task retry?); dropping its rows before opening version {}",
            open, version);
        dropIfLive(open.base);
      }
      open = null;
    }
    long restarts = client.restarts();
    refreshLive(version, lineage(uniqueId));
    live.rows.endBatch();
    Engine engine = Engine.executor();
    ChangeStream stream = new ChangeStream(client, version + 1, engine::newLocalFile, engine.budget(), false);
    ChangeLog changes = format.newChangeLog(Math.min(lastChanges, MAX_EXPECTED_CHANGES), stream);
    open = new SparkStateStore(this, live, changes, stream, unreportedLoad, restarts);
    unreportedLoad = Metrics.Load.NONE;
    return open;
  }

  @Override
  public synchronized ReadStateStore getReadStore(long version, Option<String> uniqueId) {
    checkVersion(version, uniqueId);
    if (open == null) {
      refreshLive(version, lineage(uniqueId));
      liveReaders++;
      return new SparkStateReadStore(this, live, false);
    }
    // A write store is open: read a private copy so it cannot see uncommitted changes.
    noteQueryId();
    return new SparkStateReadStore(this, load(version, null, lineage(uniqueId)).state, true);
  }

  private void checkVersion(long version, Option<String> uniqueId) {
    if (version < 0) {
      throw new IllegalArgumentException("spark_state: cannot get version " + version + " of " + this);
    }
  }

  /** The commit of a version Spark names (checkpoint format v2), or null: the version's latest commit. */
  private static String lineage(Option<String> uniqueId) {
    return uniqueId != null && uniqueId.isDefined() ? uniqueId.get() : null;
  }

  boolean checkpointIds() {
    return checkpointIds;
  }

  /**
   * Makes {@link #live} hold {@code version} as storage has it now. The map held is kept only while
   * storage still holds the very commit it was built from: another attempt of a task (a retry on
   * another executor, a speculative copy) may have re-committed that version since, and the next
   * commit must not build on state nobody has.
   */
  private void refreshLive(long version, String lineage) {
    noteQueryId();
    StateVersion held = live != null && live.version == version ? live : null;
    long t0 = System.nanoTime();
    StateVersion before = live;
    live = null;
    Loaded loaded;
    try {
      loaded = load(version, held, lineage);
      live = loaded.state;
    } finally {
      if (before != null && (live == null || before.rows != live.rows)) {
        before.rows.close();
      }
    }
    heldVersion = version;
    if (live != held) {
      unreportedLoad = unreportedLoad.plus(new Metrics.Load((System.nanoTime() - t0) / 1_000_000L, loaded.rows,
          loaded.bytesRead, loaded.image ? 1 : 0));
    }
  }

  /** The running query's id, from the task's local properties: the store's identity includes it. */
  private void noteQueryId() {
    TaskContext ctx = TaskContext.get();
    client.useQueryId(ctx == null ? null : ctx.getLocalProperty(QUERY_ID_PROPERTY));
  }

  /**
   * {@code version} from the worker (version 0 is empty without asking), with what loading it cost;
   * {@code known} itself when it is that version and storage still holds its commit. {@code lineage}: the
   * commit of the version Spark names (checkpoint format v2), null for the version's latest commit.
   */
  private Loaded load(long version, StateVersion known, String lineage) {
    if (version == 0) {
      return new Loaded(known != null ? known : new StateVersion(newMap(0), 0, null, format.typed()), 0, 0, false);
    }
    long t0 = System.nanoTime();
    String knownId = known == null ? null : known.commitId;
    boolean lazy = !IMAGES_FAILED.contains(stateStoreId);
    StoreClient.Loader<Loaded> loader = (rows, commitId, image, state) -> image == null
        ? decodeWhole(version, rows, commitId, state) : onImage(version, lineage, rows, commitId, image, state);
    StoreClient.Answer<Loaded> answer = client.load(version, knownId, lineage, lazy, loader);
    long bytesRead = answer.bytesRead();
    if (answer.value() == REMOTE_IMAGE_UNUSABLE) {   // no local copy of it here: the image downloaded whole may open
      answer = client.load(version, knownId, lineage, true, false, loader);
      bytesRead += answer.bytesRead();
    }
    if (answer.value() == IMAGE_UNUSABLE || answer.value() == REMOTE_IMAGE_UNUSABLE) {
      answer = client.load(version, knownId, lineage, false, (rows, commitId, image, state) ->
          decodeWhole(version, rows, commitId, state));
      bytesRead += answer.bytesRead();
    }
    if (answer.value() == null) {
      return new Loaded(known, 0, bytesRead, false);
    }
    Loaded loaded = answer.value().reading(bytesRead);
    long images = loaded.state.rows.stats().diskRows();
    if (images > 0) {
      LOG.info("spark_state: loaded version {} of {} lazily (a row image of {} rows, the changes after it on the heap) "
          + "in {} ms", version, stateStoreId, images, (System.nanoTime() - t0) / 1_000_000L);
    } else {
      LOG.info("spark_state: loaded version {} of {} ({} keys) in {} ms", version, stateStoreId,
          loaded.state.rows.size(), (System.nanoTime() - t0) / 1_000_000L);
    }
    return loaded;
  }

  /**
   * A version the worker answered, and what loading it cost, for the store's metrics: the rows decoded onto
   * the heap, the bytes the worker read from storage, and whether a row image was opened.
   */
  private record Loaded(StateVersion state, long rows, long bytesRead, boolean image) {
    Loaded reading(long bytes) {
      return new Loaded(state, rows, bytes, image);
    }
  }

  /** The most rows a deferred load's changes pre-size the heap table for (it grows past that as they come). */
  private static final long DEFERRED_CHANGES_HINT = 1L << 16;

  /** What a lazy load answers when the row image it names cannot be opened: load again, whole rows. */
  private static final Loaded IMAGE_UNUSABLE = new Loaded(null, 0, 0, false);

  /**
   * What a lazy load answers when a remote image to read by range cannot be opened (its local copy cannot be
   * made: the executor's local disk): load again with the image downloaded, then whole rows.
   */
  private static final Loaded REMOTE_IMAGE_UNUSABLE = new Loaded(null, 0, 0, false);

  private Loaded decodeWhole(long version, long rows, String commitId, InputStream state) throws IOException {
    StateMap map = newMap(rows);
    try {
      boolean typed = ArrowCodec.decodeState(state, keySchema, valueSchema, map::put);
      return new Loaded(new StateVersion(map, version, commitId, typed), rows, 0, false);
    } catch (IOException | RuntimeException e) {
      map.close();
      throw e;
    }
  }

  /**
   * A lazy load's answer: the snapshot's row image as the bottom of the store, and the {@code changes}
   * after it (deletes as null values) on top. No row of the image is decoded. A deferred load's changes
   * come with the store's first use ({@link DeferredRestore}).
   */
  private Loaded onImage(long version, String lineage, long changes, String commitId, StoreClient.Image image,
      InputStream state) throws IOException {
    // deferred changes are counted before folding (a key of every delta once per delta): a hint, not a size
    long expected = image.deferred != null ? Math.min(changes, DEFERRED_CHANGES_HINT) : changes;
    Restore restore = image.remote()
        ? Engine.executor().restore(spec, remoteImage(image), image.rows, expected)
        : Engine.executor().restore(spec, image.path, image.rows, image.temporary, expected);
    if (restore == null) {
      return image.remote() ? REMOTE_IMAGE_UNUSABLE : IMAGE_UNUSABLE;
    }
    if (image.deferred != null) {
      StoreClient c = client;
      Metrics.LateLoads late = new Metrics.LateLoads();
      StateMap rows = new DeferredRestore(restore, image.keys, r -> {
        long t0 = System.nanoTime();
        StoreClient.Answer<Long> answer = c.changesAfterImage(version, commitId, lineage, image,
            (n, id, none, body) -> {
              if (n > 0 && ArrowCodec.decodeState(body, keySchema, valueSchema, r::change, true) != image.typed) {
                throw new IOException("the changes after row image " + image.id + " are not in its file format");
              }
              return n;   // folded: each key once
            });
        late.add(new Metrics.Load((System.nanoTime() - t0) / 1_000_000L, answer.value(), answer.bytesRead(), 0));
      });
      // the rows and bytes of the changes are counted as they arrive (the version's lateLoads), not here
      return new Loaded(new StateVersion(rows, version, commitId, image.typed, late), 0, 0, true);
    }
    try {
      boolean typed = image.typed;
      if (changes > 0) {
        typed = ArrowCodec.decodeState(state, keySchema, valueSchema, restore::change, true);
      }
      return new Loaded(new StateVersion(restore.finish(image.keys), version, commitId, typed), changes, 0, true);
    } catch (IOException | RuntimeException e) {
      restore.abandon();
      throw e;
    }
  }

  /**
   * A remote image as the engine reads it: its blocks fetched through this store's worker client (the worker
   * reads the checkpoint storage; the JVM speaks none of its protocols).
   */
  private RemoteImage remoteImage(StoreClient.Image image) {
    StoreClient c = client;
    String file = image.file;
    RangeReader reader = (from, to, body) -> {
      try {
        c.fetch(file, from, to, body::read);
      } catch (StoreClient.Damaged e) {   // gone or truncated: a retry would meet it again
        throw RowImageException.lost(image.id, e);
      }
    };
    return new RemoteImage(image.id, image.checksum, image.size, image.tailFrom, image.tailTo, image.tail, reader);
  }

  /**
   * A row image failed under a store (a read of a damaged block): later loads of this provider load rows. A
   * remote image's bytes that could not be fetched are not damage: the retry restores from the image again.
   */
  void imageFailed(RowImageException e) {
    if (e.damaged() && IMAGES_FAILED.add(stateStoreId)) {
      LOG.warn("spark_state: {}: {}; its next loads read the checkpoint's rows instead of row images", this,
          e.getMessage());
    }
  }

  /** The row store of a version with about {@code expectedRows} keys. */
  private StateMap newMap(long expectedRows) {
    return Engine.executor().newStore(spec, expectedRows);
  }

  /**
   * Ships {@code store}'s batch as the next version: its change log, or its whole rows when storage
   * holds the base version in the other format (executors that disagree on it: typed changes cannot
   * build on opaque files, nor the reverse); the worker refuses it if storage holds another base
   * commit. Makes the new version the live one; returns the worker's reply (bytes written, the new commit id).
   */
  StoreClient.Committed commit(SparkStateStore store, ChangeLog changes, ChangeStream stream) {
    StateVersion base = store.base;
    long newVersion = base.version + 1;
    boolean whole = base.needsWholeCommit(format);
    boolean repeatedKeys = !whole && changes.mayRepeatKeys();
    long changed = changes.size();
    if (!storeDirectoryMade) {   // before a whole state is streamed: nothing may fail between that and its commit
      createStoreDirectory();
      storeDirectoryMade = true;
    }
    ArrowCodec.Body body;
    ChangeStream streamed = null;
    try {
      if (whole) {
        changes.close();   // drops what the batch streamed: the whole state replaces it
        if (format.typed()) {   // typed rows leave the JVM a chunk at a time, as a batch's changes do
          Engine engine = Engine.executor();
          streamed = new ChangeStream(client, newVersion, engine::newLocalFile, engine.budget(), true);
          body = logAll(base.rows, streamed);
        } else {
          body = format.encode(base.rows.iterator(), base.rows.size());
        }
      } else {
        streamed = stream != null && stream.chunks() > 0 ? stream : null;
        body = changes.finish();
      }
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot encode the changes of " + this, e);
    }
    int minVersions = storeConf.minVersionsToRetain();
    long keys = base.rows.knownSize();
    StoreClient.Committed reply = streamed != null
        ? streamed.commit(base.commitId, minVersions, repeatedKeys, keys, body)
        : client.commit(newVersion, base.commitId, minVersions, whole, repeatedKeys, null, 0, keys, body);
    SparkCompat.reportCommitIfValidating(storeConf, newVersion, stateStoreId, hadoopConf);
    noteMaintenance(reply.maintenance);
    synchronized (this) {
      if (live == base) {
        live = base.next(reply.commitId, format.typed());
        live.rows.endBatch();
      }
      heldVersion = newVersion;
      lastChanges = changed;
      if (open == store) {
        open = null;
      }
      closeLiveIfUnused();
    }
    return reply;
  }

  /**
   * Every row of {@code rows} (the whole state) through a change log that streams full chunks to {@code stream}
   * and answers the rest: the state never sits in the heap encoded whole, outside the memory budget.
   */
  private ArrowCodec.Body logAll(StateMap rows, ChangeStream stream) throws IOException {
    ChangeLog all = format.newChangeLog(rows.size(), stream);
    try {
      Iterator<UnsafeRowPair> it = rows.iterator();
      while (it.hasNext()) {
        UnsafeRowPair p = it.next();
        all.add(p.key(), p.value(), false);
      }
      return all.finish();
    } catch (IOException | RuntimeException | Error e) {
      all.close();   // and what was streamed is dropped on the worker
      throw e;
    }
  }

  /** The store's rows hold uncommitted changes: drop them, the next store reloads its version. */
  synchronized void aborted(SparkStateStore store, boolean commitSent) {
    store.markAborted();
    dropIfLive(store.base);
    if (open == store) {
      open = null;
    }
    closeLiveIfUnused();
    if (commitSent) {
      // The worker may hold part of version+1: tell it to drop it (best effort; a killed task's interrupt
      // is set aside for the request by StoreClient.abort).
      long version = store.version() + 1;
      try {
        client.abort(version, null);
      } catch (RuntimeException e) {
        LOG.warn("spark_state: abort of version {} of {} failed: {}", version, stateStoreId, e.toString());
      }
    }
  }

  /** Forgets the live version if it is {@code version} (its rows were changed by a store that did not commit). */
  private void dropIfLive(StateVersion version) {
    if (live == version) {
      live = null;
      version.rows.close();
    }
  }

  // ------------------------------------------------------------------ history (SupportsFineGrainedReplay)
  // Spark's change feed and snapshot replay, read by ChangeFeed. Spark 4.1+ passes checkpoint ids
  // (refused, as in getStore); Spark 4.0 declares the shorter signatures (no @Override, see SparkCompat).

  public NextIterator<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> getStateStoreChangeDataReader(
      long startVersion, long endVersion, Option<String> colFamilyNameOpt, Option<String> endStateStoreCkptId) {
    checkVersion(endVersion, endStateStoreCkptId);
    Unsupported.checkColumnFamily(colFamilyNameOpt.isDefined() ? colFamilyNameOpt.get() : null, this);
    return history().changes(startVersion, endVersion);
  }

  /** Spark 4.0. */
  public NextIterator<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> getStateStoreChangeDataReader(
      long startVersion, long endVersion, Option<String> colFamilyNameOpt) {
    return getStateStoreChangeDataReader(startVersion, endVersion, colFamilyNameOpt, Option.empty());
  }

  public StateStore replayStateFromSnapshot(long snapshotVersion, long endVersion, boolean readOnly,
      Option<String> startStateStoreCkptId, Option<String> endStateStoreCkptId) {
    checkVersion(snapshotVersion, startStateStoreCkptId);
    checkVersion(endVersion, endStateStoreCkptId);
    return new SparkStateStore(this, replayed(snapshotVersion, endVersion, endStateStoreCkptId),
        format.newChangeLog(0, null), null, Metrics.Load.NONE, client.restarts());
  }

  /** Spark 4.0. */
  public StateStore replayStateFromSnapshot(long snapshotVersion, long endVersion) {
    return replayStateFromSnapshot(snapshotVersion, endVersion, false, Option.empty(), Option.empty());
  }

  public ReadStateStore replayReadStateFromSnapshot(long snapshotVersion, long endVersion,
      Option<String> startStateStoreCkptId, Option<String> endStateStoreCkptId) {
    checkVersion(snapshotVersion, startStateStoreCkptId);
    checkVersion(endVersion, endStateStoreCkptId);
    return new SparkStateReadStore(this, replayed(snapshotVersion, endVersion, endStateStoreCkptId), true);
  }

  /**
   * A replay reads each version's latest commit: under checkpoint format v2 the end version must be the commit
   * Spark names, else the replay would show another attempt's state.
   */
  private StateVersion replayed(long snapshotVersion, long endVersion, Option<String> endId) {
    StateVersion version = history().replay(snapshotVersion, endVersion);
    String wanted = lineage(endId);
    if (wanted != null && !wanted.equals(version.commitId)) {
      version.rows.close();
      throw new IllegalStateException("spark_state: " + this + " cannot replay version " + endVersion
          + " as checkpoint " + wanted + ": storage's latest commit of that version is " + version.commitId
          + " (another attempt of its batch wrote last). Read the state at that batch without snapshotStartBatchId.");
    }
    return version;
  }

  /** Spark 4.0. */
  public ReadStateStore replayReadStateFromSnapshot(long snapshotVersion, long endVersion) {
    return replayReadStateFromSnapshot(snapshotVersion, endVersion, Option.empty(), Option.empty());
  }

  private ChangeFeed history() {
    return new ChangeFeed(client, keySchema, valueSchema, this::newMap);
  }

  // ------------------------------------------------------------------ maintenance, close, metrics

  @Override
  public void doMaintenance() {
    long version = heldVersion;
    if (client == null || version < 1) {
      return;   // nothing loaded or committed here: nothing to retain around
    }
    try {
      noteMaintenance(client.maintenance(version, storeConf.minVersionsToRetain()));
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

  /** Records the worker's maintenance status of this store; a new failure is logged once. */
  private void noteMaintenance(StoreClient.Maintenance status) {
    StoreClient.Maintenance before = maintenance;
    if (status.error != null && (before == null || !status.error.equals(before.error))) {
      LOG.warn("spark_state: maintenance of {} failed ({} run(s) in a row): {}", stateStoreId, status.failures,
          status.error);
    }
    maintenance = status;
  }

  long maintenanceFailures() {
    StoreClient.Maintenance m = maintenance;
    return m == null ? 0 : m.failures;
  }

  /** Worker restarts this provider's requests made (a store reports those of its batch). */
  long workerRestarts() {
    return client.restarts();
  }

  /** A read store sharing {@link #live}'s rows is done with them (released, aborted, or its task ended). */
  synchronized void released(SparkStateReadStore store) {
    liveReaders--;
    closeLiveIfUnused();
  }

  /**
   * Spark unloads a provider from its maintenance thread when the coordinator lists the store as active
   * elsewhere (a task moved, a speculative copy, an executor that came back), or when its query stops,
   * and a task of this executor may still be running on it (reading a version, then writing it: Spark's
   * aggregation opens a read store and upgrades it): its stores keep working, commit or abort as usual,
   * and the rows are closed when the last of them is done.
   */
  @Override
  public synchronized void close() {
    closed = true;
    closeLiveIfUnused();
  }

  /**
   * Closes the rows of a closed provider once no store uses them: at the end of the task when one runs
   * (Spark reads a committed store's rows and metrics after commit), else now.
   */
  private void closeLiveIfUnused() {
    if (!closed || open != null || liveReaders > 0 || live == null) {
      return;
    }
    StateMap rows = live.rows;
    live = null;
    TaskContext ctx = TaskContext.get();
    if (ctx != null && !ctx.isCompleted()) {
      ctx.addTaskCompletionListener((TaskCompletionListener) done -> rows.close());
    } else {
      rows.close();
    }
  }

  @Override
  public scala.collection.immutable.Seq<StateStoreCustomMetric> supportedCustomMetrics() {
    return CollectionConverters.asScala(Metrics.ALL).toList();
  }

  @Override
  public String toString() {
    return stateStoreId == null ? "SparkStateProvider[uninitialized]"
        : "SparkStateProvider[operator=" + stateStoreId.operatorId() + ", partition=" + stateStoreId.partitionId()
            + ", store=" + stateStoreId.storeName() + ", checkpoint=" + stateStoreId.checkpointRootLocation() + "]";
  }
}
