import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Drives the spark_state provider (no Spark session) through a batch that changes keys twice: updated twice,
 * put then removed, removed then put; for tests/test_flat_encoder.py. Args: checkpoint dir, Python. Prints
 * {@code LIVE <rows>} (the provider's own map after the commit) and {@code LOADED <rows>} (a new provider
 * loading the version from the worker), rows as sorted {@code k=n/s}.
 */
public class ChangeLogProbe {
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false)
      .add("s", DataTypes.StringType, true);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

  public static void main(String[] args) throws Exception {
    String dir = args[0];
    String python = args[1];
    StateStoreProvider p = Probes.provider(dir, python, VALUE);
    StateStore s = p.getStore(0, scala.Option.empty(), false, false);
    put(s, 1, 10);
    put(s, 2, 20);
    put(s, 3, 29);
    put(s, 3, 30);
    put(s, 6, 60);
    s.remove(Probes.key(6), Probes.CF);
    s.commit();
    s = p.getStore(1, scala.Option.empty(), false, false);
    put(s, 1, 11);
    put(s, 1, 12);
    put(s, 4, 40);
    s.remove(Probes.key(4), Probes.CF);
    s.remove(Probes.key(2), Probes.CF);
    put(s, 2, 21);
    s.remove(Probes.key(3), Probes.CF);
    put(s, 5, 50);
    put(s, 5, 51);
    s.commit();
    System.out.println("LIVE " + rows(p.getStore(2, scala.Option.empty(), false, false)));
    StateStoreProvider fresh = Probes.provider(dir, python, VALUE);
    System.out.println("LOADED " + rows(fresh.getStore(2, scala.Option.empty(), false, false)));
    System.exit(0);
  }

  static void put(StateStore s, long k, long n) {
    UnsafeRow v = VALUES.apply(new GenericInternalRow(new Object[] {n, UTF8String.fromString("v" + n)})).copy();
    s.put(Probes.key(k), v, Probes.CF);
  }

  static String rows(StateStore s) {
    List<String> out = new ArrayList<>();
    scala.collection.Iterator<UnsafeRowPair> it = s.iterator(Probes.CF);
    while (it.hasNext()) {
      UnsafeRowPair r = it.next();
      out.add(r.key().getLong(0) + "=" + r.value().getLong(0) + "/" + r.value().getUTF8String(1));
    }
    s.abort();
    Collections.sort(out);
    return String.join(",", out);
  }
}
