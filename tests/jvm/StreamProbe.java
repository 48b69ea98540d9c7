import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Drives a provider (no Spark session) through batches whose changes stream to the worker while they run
 * (run with -Dio.sparkstate.streamChunkBytes=1: every full Arrow batch of 16384 changes is a chunk); for
 * tests/jvm/test_change_log.py. Args: checkpoint dir, Python. Prints one line per phase and {@code LIVE} /
 * {@code LOADED} digests ({@code rows sum-of-n}) of the last version, in this JVM and in a new provider.
 */
public class StreamProbe {
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false)
      .add("s", DataTypes.StringType, true);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

  public static void main(String[] args) throws Exception {
    StateStoreProvider p = Probes.provider(args[0], args[1], VALUE, "snapshotInterval", "100");
    // v1: a new store's first version, 60,000 keys (several chunks and a tail)
    StateStore s = p.getStore(0, scala.Option.empty(), false, false);
    for (long k = 0; k < 60_000; k++) {
      put(s, k, k);
    }
    s.commit();
    // v2: a delta updating half the keys and removing 100
    s = p.getStore(1, scala.Option.empty(), false, false);
    for (long k = 0; k < 30_000; k++) {
      put(s, k, k + 1_000_000);
    }
    for (long k = 59_900; k < 60_000; k++) {
      s.remove(Probes.key(k), Probes.CF);
    }
    s.commit();
    System.out.println("STREAMED 2");
    // v3: the worker is killed after some chunks went out; the commit sends them again to the new worker
    s = p.getStore(2, scala.Option.empty(), false, false);
    for (long k = 0; k < 40_000; k++) {
      put(s, k, k + 2_000_000);
      if (k == 35_000) {
        Thread.sleep(500);   // the first two chunks are answered
        System.out.println("KILLED " + killWorker());
      }
    }
    s.commit();
    System.out.println("REPLAYED 3 restarts=" + s.metrics().customMetrics().size());
    // v4, aborted mid-stream: nothing of it is visible, and the worker drops the file it was writing
    s = p.getStore(3, scala.Option.empty(), false, false);
    for (long k = 0; k < 40_000; k++) {
      put(s, k, -1);
    }
    s.abort();
    System.out.println("ABORTED 4");
    // v4 again: a key changed in two chunks (the worker keeps its last change)
    s = p.getStore(3, scala.Option.empty(), false, false);
    for (long k = 0; k < 40_000; k++) {
      put(s, k, k + 3_000_000);
    }
    put(s, 5, 7);
    s.commit();
    System.out.println("LIVE " + Probes.digest(p.getStore(4, scala.Option.empty(), false, false)));
    StateStoreProvider fresh = Probes.provider(args[0], args[1], VALUE, "snapshotInterval", "100");
    System.out.println("LOADED " + Probes.digest(fresh.getStore(4, scala.Option.empty(), false, false)));
    System.exit(0);
  }

  /** SIGKILLs this JVM's state worker; returns how many processes were killed. */
  static long killWorker() {
    return ProcessHandle.current().descendants()
        .filter(h -> h.info().commandLine().orElse("").contains("spark_state.worker"))
        .peek(ProcessHandle::destroyForcibly).count();
  }

  static void put(StateStore s, long k, long n) {
    UnsafeRow v = VALUES.apply(new GenericInternalRow(new Object[] {n, UTF8String.fromString("v" + n)})).copy();
    s.put(Probes.key(k), v, Probes.CF);
  }
}
