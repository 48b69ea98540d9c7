import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The commit that turns a format-1 store typed sends its whole state, and streams it as a batch's changes
 * stream (run with -Dio.sparkstate.streamChunkBytes=1: every Arrow batch of 16384 rows is a chunk); for
 * tests/jvm/test_change_log.py. Args: checkpoint dir, Python. Version 1 is written by a provider that keeps
 * opaque rows (file format 1, as an older spark_state did), version 2 by a typed one. Prints {@code LIVE} and
 * {@code LOADED} digests ({@code rows sum-of-n}) of version 2, in this JVM and in a new provider.
 */
public class WholeStreamProbe {
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

  public static void main(String[] args) throws Exception {
    System.setProperty("spark_state.opaqueRows", "true");   // read when a provider is created
    StateStoreProvider opaque = Probes.provider(args[0], args[1], VALUE, "snapshotInterval", "100");
    StateStore s = opaque.getStore(0, scala.Option.empty(), false, false);
    for (long k = 0; k < 60_000; k++) {
      put(s, k, k);
    }
    s.commit();
    opaque.close();
    System.clearProperty("spark_state.opaqueRows");
    StateStoreProvider typed = Probes.provider(args[0], args[1], VALUE, "snapshotInterval", "100");
    s = typed.getStore(1, scala.Option.empty(), false, false);
    for (long k = 0; k < 10; k++) {
      put(s, k, k + 1_000_000);
    }
    s.commit();
    System.out.println("LIVE " + Probes.digest(typed.getStore(2, scala.Option.empty(), false, false)));
    StateStoreProvider fresh = Probes.provider(args[0], args[1], VALUE, "snapshotInterval", "100");
    System.out.println("LOADED " + Probes.digest(fresh.getStore(2, scala.Option.empty(), false, false)));
    System.exit(0);
  }

  static void put(StateStore s, long k, long n) {
    UnsafeRow v = VALUES.apply(new GenericInternalRow(new Object[] {n})).copy();
    s.put(Probes.key(k), v, Probes.CF);
  }
}
