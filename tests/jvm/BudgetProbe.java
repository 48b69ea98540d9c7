import java.util.Map;
import java.util.TreeMap;

import io.sparkstate.shim.memory.MemoryBudget;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A provider (no Spark session, a real worker) under a memoryLimit of 256 KiB, its state about eight times
 * that, for tests/jvm/test_budget.py. A thread samples the executor's budget every millisecond throughout:
 * six batches of puts (their changes streamed to the worker as they run), then a new provider loading the last
 * version. Args: checkpoint dir, Python. Prints {@code LIMIT bytes}, {@code MAX total kind=bytes ...} (the most
 * each kind and all together ever held), {@code RECORD bytes} (the largest row put), {@code COMMITTED kind=bytes
 * ...} (what the change log and streamed chunks hold after each commit, summed), {@code LOADED rows sum}
 * (the version the new provider loaded) with {@code EXPECTED rows sum}, and {@code CLOSED kind=bytes ...} once
 * both providers closed.
 */
public class BudgetProbe {
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false)
      .add("s", DataTypes.StringType, false);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);
  static final int KEYS = 12_000;
  static final MemoryBudget BUDGET = MemoryBudget.executor();
  static final Map<String, Long> MAX = new TreeMap<>();
  static volatile long maxTotal;

  static synchronized void sample() {
    maxTotal = Math.max(maxTotal, BUDGET.used());
    BUDGET.usedByKind().forEach((k, v) -> MAX.merge(k, v, Math::max));
  }

  public static void main(String[] args) throws Exception {
    Thread sampler = new Thread(() -> {
      while (!Thread.currentThread().isInterrupted()) {
        sample();
        try {
          Thread.sleep(1);
        } catch (InterruptedException e) {
          return;
        }
      }
    });
    sampler.setDaemon(true);
    sampler.start();
    String[] options = {"memoryLimit", "256k", "snapshotInterval", "3"};
    StateStoreProvider p = Probes.provider(args[0], args[1], VALUE, options);
    long[] model = new long[KEYS];
    java.util.Arrays.fill(model, -1);
    int record = 0;
    long changesAfter = 0;
    long streamAfter = 0;
    for (int batch = 0; batch < 6; batch++) {
      StateStore s = p.getStore(batch, scala.Option.empty(), false, false);
      for (int i = 0; i < 4_000; i++) {
        int k = (batch * 2_500 + i) % KEYS;
        long n = k + batch * 1_000_000L;
        var key = Probes.key(k);
        var value = VALUES.apply(new GenericInternalRow(new Object[] {n, UTF8String.fromString(text(k, batch))}));
        record = Math.max(record, key.getSizeInBytes() + value.getSizeInBytes());
        s.put(key, value, Probes.CF);
        model[k] = n;
        if (i % 16 == 0) {
          sample();
        }
      }
      for (int k = batch; k < KEYS; k += 97) {   // a few removes
        s.remove(Probes.key(k), Probes.CF);
        model[k] = -1;
      }
      sample();
      s.commit();
      sample();
      changesAfter += BUDGET.used("changes");
      streamAfter += BUDGET.used("stream");
    }
    p.close();
    StateStoreProvider q = Probes.provider(args[0], args[1], VALUE, options);
    String loaded = Probes.digest(q.getStore(6, scala.Option.empty(), false, false));
    sample();
    q.close();
    sampler.interrupt();
    sampler.join();
    long rows = 0;
    long sum = 0;
    for (long n : model) {
      if (n >= 0) {
        rows++;
        sum += n;
      }
    }
    StringBuilder max = new StringBuilder("MAX " + maxTotal);
    MAX.forEach((k, v) -> max.append(' ').append(k).append('=').append(v));
    System.out.println("LIMIT " + BUDGET.limit());
    System.out.println(max);
    System.out.println("RECORD " + record);
    System.out.println("COMMITTED changes=" + changesAfter + " stream=" + streamAfter);
    System.out.println("LOADED " + loaded);
    System.out.println("EXPECTED " + rows + " " + sum);
    // a merge still running in the background holds the runs it reads (and their cached blocks) until it ends
    for (long until = System.nanoTime() + 20_000_000_000L; System.nanoTime() < until; ) {
      if (BUDGET.usedByKind().values().stream().allMatch(v -> v == 0)) {
        break;
      }
      Thread.sleep(20);
    }
    StringBuilder closed = new StringBuilder("CLOSED");
    BUDGET.usedByKind().forEach((k, v) -> closed.append(' ').append(k).append('=').append(v));
    System.out.println(closed);
    System.exit(0);
  }

  /** A value's text: about 100 bytes. */
  static String text(int k, int batch) {
    StringBuilder sb = new StringBuilder().append(k).append('/').append(batch).append(':');
    while (sb.length() < 100) {
      sb.append((char) ('a' + (k * 31 + sb.length()) % 26));
    }
    return sb.toString();
  }
}
