import java.io.File;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * A provider closed (unloaded by Spark's maintenance thread) while a task's store is open on it; for
 * tests/jvm/test_provider_unload.py. Args: checkpoint dir, Python. Prints {@code COMMITTED <version>},
 * {@code ABORTED}, {@code READ} (what a read store whose provider closed reads) and {@code LOADED <rows> <sum>}
 * of the last version as a new provider loads it.
 */
public class UnloadProbe {
  static final StructType KEY = new StructType().add("k", DataTypes.LongType, false);
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false);
  static final UnsafeProjection KEYS = UnsafeProjection.create(KEY);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);
  static final String CF = StateStore.DEFAULT_COL_FAMILY_NAME();

  public static void main(String[] args) throws Exception {
    StateStoreProvider p = provider(args[0], args[1]);
    StateStore s = p.getStore(0, scala.Option.empty(), false, false);
    for (long k = 0; k < 1_000; k++) {
      put(s, k, k);
    }
    s.commit();
    // v2: the provider is closed half-way through the batch; the task's store goes on and commits
    s = p.getStore(1, scala.Option.empty(), false, false);
    for (long k = 0; k < 500; k++) {
      put(s, k, k + 1_000);
    }
    p.close();
    for (long k = 500; k < 1_500; k++) {
      put(s, k, k + 1_000);
    }
    s.remove(key(0), CF);
    long seen = s.get(key(1), CF).getLong(0);
    System.out.println("COMMITTED " + s.commit() + " " + seen);
    // a batch on a new provider, closed mid-batch, then aborted: nothing of it is stored
    StateStoreProvider q = provider(args[0], args[1]);
    s = q.getStore(2, scala.Option.empty(), false, false);
    for (long k = 0; k < 1_500; k++) {
      put(s, k, -1);
    }
    q.close();
    s.abort();
    System.out.println("ABORTED");
    // a read store (Spark's aggregation reads a version, then upgrades the read to a write store) whose
    // provider is closed before it reads
    StateStoreProvider r = provider(args[0], args[1]);
    ReadStateStore read = r.getReadStore(2, scala.Option.empty());
    r.close();
    System.out.println("READ " + read.get(key(1), CF).getLong(0) + " " + (read.get(key(0), CF) == null));
    read.abort();
    StateStoreProvider fresh = provider(args[0], args[1]);
    System.out.println("LOADED " + digest(fresh.getStore(2, scala.Option.empty(), false, false)));
    System.exit(0);
  }

  static StateStoreProvider provider(String dir, String python) {
    SQLConf c = new SQLConf();
    c.setConfString("spark.sql.streaming.stateStore.providerClass", "io.sparkstate.shim.SparkStateProvider");
    c.setConfString("spark.sql.streaming.stateStore.sparkState.storage", "filesystem");
    c.setConfString("spark.sql.streaming.stateStore.sparkState.python", python);
    scala.collection.immutable.Map<String, String> extra = scala.collection.immutable.Map$.MODULE$.empty();
    extra = extra.updated("spark.sql.streaming.stateStore.sparkState.storage", "filesystem");
    extra = extra.updated("spark.sql.streaming.stateStore.sparkState.python", python);
    StateStoreId id = new StateStoreId(new File(dir).toURI().toString(), 0L, 0, StateStoreId.DEFAULT_STORE_NAME());
    return StateStoreProvider.createAndInit(new StateStoreProviderId(id, new UUID(42, 42)), KEY, VALUE,
        new NoPrefixKeyStateEncoderSpec(KEY), false, new StateStoreConf(c, extra), new Configuration(), false,
        scala.Option.empty());
  }

  static UnsafeRow key(long k) {
    return KEYS.apply(new GenericInternalRow(new Object[] {k})).copy();
  }

  static void put(StateStore s, long k, long n) {
    s.put(key(k), VALUES.apply(new GenericInternalRow(new Object[] {n})).copy(), CF);
  }

  static String digest(StateStore s) {
    long rows = 0;
    long sum = 0;
    scala.collection.Iterator<UnsafeRowPair> it = s.iterator(CF);
    while (it.hasNext()) {
      rows++;
      sum += it.next().value().getLong(0);
    }
    s.abort();
    return rows + " " + sum;
  }
}
