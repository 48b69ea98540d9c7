import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * A provider closed (unloaded by Spark's maintenance thread) while a task's store is open on it; for
 * tests/jvm/test_provider_unload.py. Args: checkpoint dir, Python. Prints {@code COMMITTED <version>},
 * {@code ABORTED}, {@code READ} (what a read store whose provider closed reads) and {@code LOADED <rows> <sum>}
 * of the last version as a new provider loads it.
 */
public class UnloadProbe {
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

  public static void main(String[] args) throws Exception {
    StateStoreProvider p = Probes.provider(args[0], args[1], VALUE);
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
    s.remove(Probes.key(0), Probes.CF);
    long seen = s.get(Probes.key(1), Probes.CF).getLong(0);
    System.out.println("COMMITTED " + s.commit() + " " + seen);
    // a batch on a new provider, closed mid-batch, then aborted: nothing of it is stored
    StateStoreProvider q = Probes.provider(args[0], args[1], VALUE);
    s = q.getStore(2, scala.Option.empty(), false, false);
    for (long k = 0; k < 1_500; k++) {
      put(s, k, -1);
    }
    q.close();
    s.abort();
    System.out.println("ABORTED");
    // a read store (Spark's aggregation reads a version, then upgrades the read to a write store) whose
    // provider is closed before it reads
    StateStoreProvider r = Probes.provider(args[0], args[1], VALUE);
    ReadStateStore read = r.getReadStore(2, scala.Option.empty());
    r.close();
    System.out.println("READ " + read.get(Probes.key(1), Probes.CF).getLong(0) + " "
        + (read.get(Probes.key(0), Probes.CF) == null));
    read.abort();
    StateStoreProvider fresh = Probes.provider(args[0], args[1], VALUE);
    System.out.println("LOADED " + Probes.digest(fresh.getStore(2, scala.Option.empty(), false, false)));
    System.exit(0);
  }

  static void put(StateStore s, long k, long n) {
    s.put(Probes.key(k), VALUES.apply(new GenericInternalRow(new Object[] {n})).copy(), Probes.CF);
  }
}
