package io.sparkstate.shim;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;
import scala.Option;

/**
 * Writes one version of a state store in the format of one of Spark's own providers, through that
 * provider's own code, from the rows of Spark's {@code statestore} data source
 * ({@code partition_id, key, value}): what {@code spark_state.migrate(..., to="hdfs")} and
 * {@code migrate(..., to="rocksdb")} run on the executors, one task per state partition. Every byte
 * written is the provider's.
 *
 * <ul>
 *   <li><b>HDFS</b> ({@code HDFSBackedStateStoreProvider}): the provider commits version {@code v + 1}
 *       only on top of version {@code v}'s files, and a migrated store has no earlier versions. So each
 *       task commits the whole state as version 1 of a fresh provider with a forced snapshot (Spark writes
 *       {@code 1.delta} and {@code 1.snapshot}), then gives the snapshot the target version's name: the
 *       version is only in the file name, and Spark loads a version from its snapshot without any earlier
 *       file (Spark 4.3: the forced snapshot).</li>
 *   <li><b>RocksDB</b> ({@code RocksDBStateStoreProvider}): the way Spark's own offline repartition
 *       writes a version: {@code getStore(v - 1, loadEmpty = true, forceSnapshotOnCommit = true)}, every
 *       row put, committed as version {@code v} with its snapshot (Spark 4.2+).</li>
 * </ul>
 */
public final class ProviderStoreWriter implements Function2<Integer, Iterator<InternalRow>, Iterator<String>> {
  private static final long serialVersionUID = 1L;
  /** StreamExecution.RUN_ID_KEY: the provider's init reads the query run id from the Hadoop conf. */
  private static final String RUN_ID_KEY = "sql.streaming.runId";

  /** "hdfs" or "rocksdb". */
  private final String provider;
  private final String stateRoot;
  private final long operatorId;
  private final String storeName;
  private final String keySchemaJson;
  private final String valueSchemaJson;
  private final int numColsPrefixKey;
  private final long version;
  private final Map<String, String> sqlConf;
  private final SerializableConfiguration hadoopConf;

  private ProviderStoreWriter(String provider, String stateRoot, long operatorId, String storeName, StructType keySchema,
      StructType valueSchema, int numColsPrefixKey, long version, Map<String, String> sqlConf,
      Configuration hadoopConf) {
    this.provider = provider;
    this.stateRoot = stateRoot;
    this.operatorId = operatorId;
    this.storeName = storeName;
    this.keySchemaJson = keySchema.json();
    this.valueSchemaJson = valueSchema.json();
    this.numColsPrefixKey = numColsPrefixKey;
    this.version = version;
    this.sqlConf = new java.util.HashMap<>(sqlConf);
    this.hadoopConf = new SerializableConfiguration(hadoopConf);
  }

  /**
   * Writes version {@code version} of every partition of one store under {@code stateRoot} (the
   * target checkpoint's {@code state} directory) from {@code rows}, the statestore data source's
   * DataFrame of the source store (one Spark partition per state partition), with Spark's
   * {@code provider} ("hdfs" or "rocksdb"). {@code sqlConf} holds the confs the provider reads that
   * the target's offset log pins (compression codec, row checksums, RocksDB's options).
   * Returns one JSON object per partition: {@code {"partition", "rows", "bytes"}}.
   */
  public static List<String> write(Dataset<Row> rows, String provider, String stateRoot, long operatorId,
      String storeName, int numColsPrefixKey, long version, Map<String, String> sqlConf) {
    if (!provider.equals("hdfs") && !provider.equals("rocksdb")) {
      throw new IllegalArgumentException("spark_state migrate: cannot write state of provider '" + provider
          + "'; the target is 'hdfs' or 'rocksdb'.");
    }
    StructType schema = rows.schema();
    StructType keySchema = (StructType) schema.apply("key").dataType();
    StructType valueSchema = (StructType) schema.apply("value").dataType();
    Configuration hadoopConf = rows.sparkSession().sessionState().newHadoopConf();
    ProviderStoreWriter writer = new ProviderStoreWriter(provider, stateRoot, operatorId, storeName, keySchema,
        valueSchema, numColsPrefixKey, version, sqlConf, hadoopConf);
    return rows.select("partition_id", "key", "value").queryExecution().toRdd().toJavaRDD()
        .mapPartitionsWithIndex(writer, false).collect();
  }

  @Override
  public Iterator<String> call(Integer partition, Iterator<InternalRow> rows) throws Exception {
    StructType keySchema = (StructType) DataType.fromJson(keySchemaJson);
    StructType valueSchema = (StructType) DataType.fromJson(valueSchemaJson);
    StateStoreId id = new StateStoreId(stateRoot, operatorId, partition, storeName);
    Configuration conf = new Configuration(hadoopConf.value());
    conf.set(RUN_ID_KEY, UUID.randomUUID().toString());
    SQLConf sql = new SQLConf();
    for (Map.Entry<String, String> e : sqlConf.entrySet()) {
      sql.setConfString(e.getKey(), e.getValue());
    }
    KeyStateEncoderSpec spec = numColsPrefixKey > 0
        ? new PrefixKeyScanStateEncoderSpec(keySchema, numColsPrefixKey)
        : new NoPrefixKeyStateEncoderSpec(keySchema);
    boolean rocksdb = provider.equals("rocksdb");
    StateStoreProvider sparkProvider = rocksdb ? new RocksDBStateStoreProvider() : new HDFSBackedStateStoreProvider();
    sparkProvider.init(id, keySchema, valueSchema, spec, false, StateStoreConf.apply(sql), conf, false, Option.empty());
    long count = 0;
    try {
      StateStore store = rocksdb ? emptyAt(sparkProvider, version - 1) : newVersionOne(sparkProvider);
      UnsafeProjection keys = UnsafeProjection.create(keySchema);
      UnsafeProjection values = UnsafeProjection.create(valueSchema);
      int keyFields = keySchema.fields().length;
      int valueFields = valueSchema.fields().length;
      String family = StateStore.DEFAULT_COL_FAMILY_NAME();
      while (rows.hasNext()) {
        InternalRow row = rows.next();
        if (row.getInt(0) != partition) {
          store.abort();
          throw new IllegalStateException("spark_state migrate: Spark partition " + partition + " of the "
              + "statestore reader holds a row of state partition " + row.getInt(0) + "; the reader's "
              + "partitioning is not one Spark partition per state partition.");
        }
        store.put(keys.apply(row.getStruct(1, keyFields)), values.apply(row.getStruct(2, valueFields)), family);
        count++;
      }
      long committed = store.commit();
      if (committed != (rocksdb ? version : 1)) {
        throw new IllegalStateException("spark_state migrate: Spark's " + provider + " provider committed version "
            + committed + " of " + id + " where version " + (rocksdb ? version : 1) + " was expected.");
      }
    } finally {
      sparkProvider.close();
    }
    Path dir = id.storeCheckpointLocation();
    FileSystem fs = dir.getFileSystem(conf);
    if (rocksdb) {
      long bytes = 0;
      for (org.apache.hadoop.fs.FileStatus f : fs.listStatus(dir)) {
        if (f.isFile() && f.getPath().getName().startsWith(version + ".")) {
          bytes += f.getLen();
        }
      }
      return Collections.singletonList("{\"partition\":" + partition + ",\"rows\":" + count + ",\"bytes\":"
          + bytes + "}").iterator();
    }
    Path snapshot = new Path(dir, "1.snapshot");
    if (!fs.exists(snapshot)) {
      throw new IllegalStateException("spark_state migrate: Spark's HDFS provider committed " + dir
          + " without writing its snapshot " + snapshot + "; nothing else was written for this store.");
    }
    Path target = new Path(dir, version + ".snapshot");
    if (version != 1) {
      if (!fs.rename(snapshot, target)) {
        throw new IllegalStateException("spark_state migrate: cannot rename " + snapshot + " to " + target);
      }
      fs.delete(new Path(dir, "1.delta"), false);
    }
    long bytes = fs.getFileStatus(target).getLen();
    String json = "{\"partition\":" + partition + ",\"rows\":" + count + ",\"bytes\":" + bytes + "}";
    return Collections.singletonList(json).iterator();
  }

  /**
   * An empty store at {@code version} whose commit makes {@code version + 1} with its snapshot:
   * {@code getStore(version, None, forceSnapshotOnCommit = true, loadEmpty = true)}, as Spark's offline
   * repartition writes a version (Spark 4.2+).
   */
  private static StateStore emptyAt(StateStoreProvider provider, long version) throws Exception {
    Method m = widestGetStore(provider);
    if (m == null || m.getParameterCount() < 4) {
      throw new UnsupportedOperationException("spark_state migrate: writing Spark's RocksDB provider format needs "
          + "RocksDBStateStoreProvider.getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty), which Spark "
          + "4.2 added and this Spark version does not have; run the migration with pyspark 4.2 or later.");
    }
    return invoke(m, provider, version, Option.empty(), true, true);
  }

  /** {@code getStore(0)} with the forced snapshot on commit (its last two flags; Spark 4.3). */
  private static StateStore newVersionOne(StateStoreProvider provider) throws Exception {
    Method m = widestGetStore(provider);
    if (m == null || m.getParameterCount() < 3) {
      throw new UnsupportedOperationException("spark_state migrate: writing Spark's HDFS provider format needs "
          + "HDFSBackedStateStoreProvider.getStore(version, uniqueId, forceSnapshotOnCommit, ...), which this "
          + "Spark version does not have; run the migration with pyspark 4.3.");
    }
    List<Object> args = new ArrayList<>(List.of(0L, Option.empty(), true));
    while (args.size() < m.getParameterCount()) {
      args.add(false);
    }
    return invoke(m, provider, args.toArray());
  }

  /**
   * The provider's {@code getStore(long version, ...)} with the most parameters: the flags each Spark version
   * added (uniqueId, forceSnapshotOnCommit, loadEmpty) are only reachable by reflection across 4.0-4.3.
   */
  private static Method widestGetStore(StateStoreProvider provider) {
    Method best = null;
    for (Method m : provider.getClass().getMethods()) {
      if (m.getName().equals("getStore") && m.getParameterCount() >= 2
          && m.getParameterTypes()[0] == long.class && (best == null || m.getParameterCount() > best.getParameterCount())) {
        best = m;
      }
    }
    return best;
  }

  /** Calls {@code getStore}, rethrowing what it threw. */
  private static StateStore invoke(Method getStore, StateStoreProvider provider, Object... args) throws Exception {
    try {
      return (StateStore) getStore.invoke(provider, args);
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      throw cause instanceof Exception ? (Exception) cause : new IllegalStateException(cause);
    }
  }
}
