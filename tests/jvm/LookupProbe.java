import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * Spark 4.2+'s {@code keyExists} and {@code multiGet} on spark_state's stores, called through Spark's interface
 * as deduplication calls {@code keyExists}; for tests/jvm/test_lookups.py. Args: checkpoint dir, Python. Prints
 * {@code DECLARED <class of keyExists> <class of multiGet>}, and for each store checked
 * {@code <name> <keys asked> <present> <mismatches>} (a mismatch: keyExists or multiGet disagreeing with get).
 */
public class LookupProbe {
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

  public static void main(String[] args) throws Exception {
    StateStoreProvider p = Probes.provider(args[0], args[1], VALUE);
    StateStore s = p.getStore(0, scala.Option.empty(), false, false);
    for (long k = 0; k < 2_000; k++) {
      put(s, k, k);
    }
    s.commit();
    s = p.getStore(1, scala.Option.empty(), false, false);
    for (long k = 0; k < 2_000; k += 3) {
      s.remove(Probes.key(k), Probes.CF);
    }
    for (long k = 1_000; k < 2_500; k++) {
      put(s, k, k * 2);
    }
    s.commit();
    p.close();

    System.out.println("DECLARED "
        + s.getClass().getMethod("keyExists", UnsafeRow.class, String.class).getDeclaringClass().getSimpleName() + " "
        + s.getClass().getMethod("multiGet", UnsafeRow[].class, String.class).getDeclaringClass().getSimpleName());
    // a restored version on a new provider, read as deduplication and a batch lookup read it
    StateStoreProvider q = Probes.provider(args[0], args[1], VALUE);
    ReadStateStore read = q.getReadStore(2, scala.Option.empty());
    System.out.println("READ " + check(read));
    read.abort();
    // a write store with uncommitted changes: lookups see them
    StateStore w = q.getStore(2, scala.Option.empty(), false, false);
    for (long k = 0; k < 3_000; k += 7) {
      put(w, k, -k);
    }
    for (long k = 1; k < 3_000; k += 11) {
      w.remove(Probes.key(k), Probes.CF);
    }
    System.out.println("WRITE " + check(w));
    w.abort();
    q.close();
    System.exit(0);
  }

  /** Keys 0..2999 (some never stored) in a shuffled order: keyExists, and multiGet in chunks, against get. */
  static String check(ReadStateStore s) {
    List<Long> order = new ArrayList<>();
    for (long k = 0; k < 3_000; k++) {
      order.add(k);
    }
    java.util.Collections.shuffle(order, new Random(7));
    long present = 0;
    long mismatches = 0;
    for (int from = 0; from < order.size(); from += 256) {
      int to = Math.min(order.size(), from + 256);
      UnsafeRow[] keys = new UnsafeRow[to - from];
      for (int i = from; i < to; i++) {
        keys[i - from] = Probes.key(order.get(i));
      }
      scala.collection.Iterator<UnsafeRow> values = s.multiGet(keys, Probes.CF);
      List<UnsafeRow> got = new ArrayList<>();
      while (values.hasNext()) {
        got.add(values.next());
      }
      if (got.size() != keys.length) {
        mismatches += Math.abs(got.size() - keys.length);
      }
      for (int i = 0; i < keys.length; i++) {
        UnsafeRow expected = s.get(keys[i], Probes.CF);
        boolean exists = s.keyExists(keys[i], Probes.CF);
        if (expected != null) {
          present++;
        }
        if (exists != (expected != null)) {
          mismatches++;
        }
        UnsafeRow value = i < got.size() ? got.get(i) : null;
        if ((value == null) != (expected == null) || (value != null && value.getLong(0) != expected.getLong(0))) {
          mismatches++;
        }
      }
    }
    return order.size() + " " + present + " " + mismatches;
  }

  static void put(StateStore s, long k, long n) {
    s.put(Probes.key(k), VALUES.apply(new GenericInternalRow(new Object[] {n})).copy(), Probes.CF);
  }
}
