import java.io.File;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
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
 * What the provider probes share: a spark_state provider on a local directory without a Spark session, keys
 * of one long, and a digest of a version. Compiled beside every probe (tests/support/jvm_probes.py).
 */
final class Probes {
  static final String CF = StateStore.DEFAULT_COL_FAMILY_NAME();
  static final StructType KEY = new StructType().add("k", DataTypes.LongType, false);
  static final UnsafeProjection KEYS = UnsafeProjection.create(KEY);

  private Probes() {}

  /**
   * The spark_state provider of partition 0 of the store in {@code dir}, on filesystem storage, with the worker
   * run by {@code python}; {@code options} are more {@code sparkState.*} options, as name, value, name, value.
   */
  static StateStoreProvider provider(String dir, String python, StructType value, String... options) {
    String prefix = "spark.sql.streaming.stateStore.sparkState.";
    SQLConf c = new SQLConf();
    c.setConfString("spark.sql.streaming.stateStore.providerClass", "io.sparkstate.shim.SparkStateProvider");
    scala.collection.immutable.Map<String, String> extra = scala.collection.immutable.Map$.MODULE$.empty();
    String[] all = new String[options.length + 4];
    all[0] = "storage";
    all[1] = "filesystem";
    all[2] = "python";
    all[3] = python;
    System.arraycopy(options, 0, all, 4, options.length);
    for (int i = 0; i + 1 < all.length; i += 2) {
      c.setConfString(prefix + all[i], all[i + 1]);
      extra = extra.updated(prefix + all[i], all[i + 1]);
    }
    StateStoreId id = new StateStoreId(new File(dir).toURI().toString(), 0L, 0, StateStoreId.DEFAULT_STORE_NAME());
    return StateStoreProvider.createAndInit(new StateStoreProviderId(id, new UUID(42, 42)), KEY, value,
        new NoPrefixKeyStateEncoderSpec(KEY), false, new StateStoreConf(c, extra), new Configuration(), false,
        scala.Option.empty());
  }

  static UnsafeRow key(long k) {
    return KEYS.apply(new GenericInternalRow(new Object[] {k})).copy();
  }

  /** {@code rows sum}: the store's rows and the sum of their values' first (long) field; aborts the store. */
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
