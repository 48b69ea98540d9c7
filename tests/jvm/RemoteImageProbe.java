package io.sparkstate.shim.engine;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
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

import io.sparkstate.shim.worker.WorkerClient;

/**
 * spark_state providers in one JVM (an executor without a Spark session) over a checkpoint whose root is on
 * the loopback S3 server, for tests/jvm/test_remote_images.py: restores read row images by range through the
 * worker into the executor's cache of remote images. One command a line; errors answer "ERR message".
 * <pre>
 *   provider NAME DIR PYTHON PARTITION [OPTION=VALUE ...]  → OK       a provider of that store (sparkState.* options)
 *   write NAME VERSION FROM TO MULT    → OK version  keys FROM..TO-1 := k * MULT in the store of VERSION, committed
 *   remove NAME VERSION K [K ...]      → OK version  keys removed, committed
 *   drain                              → OK pending  the worker's background work (compactions, images) done
 *   open NAME VERSION                  → OK          a read store of VERSION on a new provider of NAME's store
 *   get NAME K [K ...]                 → OK and the value of each key's first column, or null
 *   check NAME FROM TO MULT            → OK n, or BAD k v: every key FROM..TO-1 reads k * MULT (MULT 0: absent)
 *   scan NAME                          → OK rows sum
 *   release NAME                       → OK          the read store and its provider closed
 *   cached                             → per copy "C file local present pages users reserved", then END
 *   warmup                             → OK ms copies files cacheBytes budgetUsed   the executor plugin's
 *                                        warm-up, then the copies and files of the image cache, the block cache's
 *                                        and the budget's bytes in use
 *   fetched                            → OK bytes requests (executor-wide, from the checkpoint storage)
 *   filled NAME TIMEOUT_MS             → OK, or TIMEOUT: every copy NAME's read store reads is complete
 * </pre>
 */
public class RemoteImageProbe {
  static final String CF = StateStore.DEFAULT_COL_FAMILY_NAME();
  static final StructType KEY = new StructType().add("k", DataTypes.LongType, false);
  static final StructType VALUE = new StructType().add("n", DataTypes.LongType, false);
  static final UnsafeProjection KEYS = UnsafeProjection.create(KEY);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

  static final class Store {
    String[] spec;
    StateStoreProvider writer;
    StateStoreProvider reader;
    ReadStateStore read;
  }

  static final Map<String, Store> STORES = new HashMap<>();

  /**
   * One Hadoop configuration for every provider, loaded once, as an executor's tasks share the broadcast one:
   * a new one loads its default resources on first use (about 10 ms), which no executor's getStore pays.
   */
  static final Configuration HADOOP_CONF = new Configuration();

  static {
    HADOOP_CONF.get("fs.defaultFS");
  }

  static StateStoreProvider provider(String[] spec) {
    String dir = spec[2];
    String python = spec[3];
    int partition = Integer.parseInt(spec[4]);
    String prefix = "spark.sql.streaming.stateStore.sparkState.";
    SQLConf c = new SQLConf();
    c.setConfString("spark.sql.streaming.stateStore.providerClass", "io.sparkstate.shim.SparkStateProvider");
    scala.collection.immutable.Map<String, String> extra = scala.collection.immutable.Map$.MODULE$.empty();
    Map<String, String> options = new HashMap<>();
    options.put("storage", "filesystem");
    options.put("python", python);
    for (int i = 5; i < spec.length; i++) {
      int eq = spec[i].indexOf('=');
      options.put(spec[i].substring(0, eq), spec[i].substring(eq + 1));
    }
    for (Map.Entry<String, String> e : options.entrySet()) {
      c.setConfString(prefix + e.getKey(), e.getValue());
      extra = extra.updated(prefix + e.getKey(), e.getValue());
    }
    new File(dir).mkdirs();   // File.toURI ends an existing directory with '/': the same URI for every provider
    StateStoreId id = new StateStoreId(new File(dir).toURI().toString(), 0L, partition,
        StateStoreId.DEFAULT_STORE_NAME());
    return StateStoreProvider.createAndInit(new StateStoreProviderId(id, new UUID(42, 42)), KEY, VALUE,
        new NoPrefixKeyStateEncoderSpec(KEY), false, new StateStoreConf(c, extra), HADOOP_CONF, false,
        scala.Option.empty());
  }

  static UnsafeRow key(long k) {
    return KEYS.apply(new GenericInternalRow(new Object[] {k})).copy();
  }

  static UnsafeRow value(long n) {
    return VALUES.apply(new GenericInternalRow(new Object[] {n})).copy();
  }

  /** pending / settled: a store restored by a deferred load, before / after its changes came; no: another store. */
  static String deferredState(Object store) throws ReflectiveOperationException {
    java.lang.reflect.Field rows = Class.forName("io.sparkstate.shim.StoreView").getDeclaredField("rows");
    rows.setAccessible(true);
    Object map = rows.get(store);
    return map instanceof DeferredRestore d ? (d.settled() ? "settled" : "pending") : "no";
  }

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
    String line;
    while ((line = in.readLine()) != null) {
      try {
        out.println(run(line.trim().split(" ")));
      } catch (Throwable e) {
        e.printStackTrace();
        out.println("ERR " + String.valueOf(e.getMessage()).replace('\n', ' '));
      }
    }
    System.exit(0);
  }

  static String run(String[] a) throws Exception {
    Store s = a.length > 1 ? STORES.get(a[1]) : null;
    switch (a[0]) {
      case "provider": {
        Store n = new Store();
        n.spec = a;
        n.writer = provider(a);
        STORES.put(a[1], n);
        return "OK";
      }
      case "write": {
        StateStore w = s.writer.getStore(Long.parseLong(a[2]), scala.Option.empty(), false, false);
        long mult = Long.parseLong(a[5]);
        for (long k = Long.parseLong(a[3]); k < Long.parseLong(a[4]); k++) {
          w.put(key(k), value(k * mult), CF);
        }
        return "OK " + w.commit();
      }
      case "remove": {
        StateStore w = s.writer.getStore(Long.parseLong(a[2]), scala.Option.empty(), false, false);
        for (int i = 3; i < a.length; i++) {
          w.remove(key(Long.parseLong(a[i])), CF);
        }
        return "OK " + w.commit();
      }
      case "drain":
        return "OK " + WorkerClient.get().drain(io.sparkstate.shim.worker.Options.from(new HashMap<>()), 120_000);
      case "open": {
        closeRead(s);
        s.reader = provider(s.spec);
        long t0 = System.nanoTime();
        s.read = s.reader.getReadStore(Long.parseLong(a[2]), scala.Option.empty());
        return "OK " + (System.nanoTime() - t0) / 1_000_000;
      }
      case "get": {
        StringBuilder sb = new StringBuilder("OK");
        for (int i = 2; i < a.length; i++) {
          UnsafeRow v = s.read.get(key(Long.parseLong(a[i])), CF);
          sb.append(' ').append(v == null ? "null" : Long.toString(v.getLong(0)));
        }
        return sb.toString();
      }
      case "check": {
        long mult = Long.parseLong(a[4]);
        long n = 0;
        for (long k = Long.parseLong(a[2]); k < Long.parseLong(a[3]); k++) {
          UnsafeRow v = s.read.get(key(k), CF);
          if (mult == 0 ? v != null : v == null || v.getLong(0) != k * mult) {
            return "BAD " + k + " " + (v == null ? "null" : Long.toString(v.getLong(0)));
          }
          n++;
        }
        return "OK " + n;
      }
      case "scan": {
        long rows = 0;
        long sum = 0;
        scala.collection.Iterator<UnsafeRowPair> it = s.read.iterator(CF);
        while (it.hasNext()) {
          rows++;
          sum += it.next().value().getLong(0);
        }
        return "OK " + rows + " " + sum;
      }
      case "release":
        closeRead(s);
        return "OK";
      case "cached": {
        StringBuilder sb = new StringBuilder();
        for (String c : Engine.executor().images().describe()) {
          sb.append("C ").append(c).append('\n');
        }
        return sb.append("END").toString();
      }
      case "warmup": {   // what the executor plugin runs when the executor starts
        long t0 = System.nanoTime();
        io.sparkstate.shim.codec.TypedCodec.warmUp();
        Engine e = Engine.executor();
        e.warmUp();
        long ms = (System.nanoTime() - t0) / 1_000_000;
        java.nio.file.Path dir = e.images().directory();
        long files;
        try (java.util.stream.Stream<java.nio.file.Path> all = java.nio.file.Files.list(dir)) {
          files = all.count();
        }
        return "OK " + ms + " " + e.images().describe().size() + " " + files + " " + e.cache().usedBytes() + " "
            + e.budget().used();
      }
      case "deferred":   // whether the read store's changes after its image are still to come (a deferred load)
        return "OK " + deferredState(s.read);
      case "metrics": {   // a writable store of version a[2] on a new provider (a restore): whether its load was
                          // deferred (pending/no), then a get of key a[3] and the load's metrics (rows loaded, bytes
                          // read, image loads); aborted
        StateStoreProvider p = provider(s.spec);
        try {
          StateStore w = p.getStore(Long.parseLong(a[2]), scala.Option.empty(), false, false);
          try {
            String deferred = deferredState(w);
            w.get(key(Long.parseLong(a[3])), CF);
            java.util.Map<String, Object> byName = new HashMap<>();
            scala.jdk.javaapi.CollectionConverters.asJava(w.metrics().customMetrics())
                .forEach((m, v) -> byName.put(m.name(), v));
            return "OK " + deferred + " " + byName.get("sparkStateRowsLoaded") + " " + byName.get("sparkStateBytesRead")
                + " " + byName.get("sparkStateImageLoads");
          } finally {
            w.abort();
          }
        } finally {
          p.close();
        }
      }
      case "killworker": {   // SIGKILLs this JVM's state worker (the next request starts a new one)
        return "OK " + ProcessHandle.current().descendants()
            .filter(h -> h.info().commandLine().orElse("").contains("spark_state.worker"))
            .peek(ProcessHandle::destroyForcibly).count();
      }
      case "fetched": {
        long[] f = Engine.executor().remoteFetches();
        return "OK " + f[0] + " " + f[1];
      }
      case "filled": {
        long end = System.currentTimeMillis() + Long.parseLong(a[2]);
        while (System.currentTimeMillis() < end) {
          boolean all = true;
          for (String c : Engine.executor().images().describe()) {
            String[] f = c.split(" ");
            if (!f[4].equals("0") && !f[2].equals(f[3])) {   // read by a store, and not complete
              all = false;
            }
          }
          if (all) {
            return "OK";
          }
          Thread.sleep(20);
        }
        return "TIMEOUT";
      }
      default:
        return "ERR unknown command " + a[0];
    }
  }

  static void closeRead(Store s) {
    if (s.read != null) {
      s.read.release();
      s.read = null;
    }
    if (s.reader != null) {
      s.reader.close();
      s.reader = null;
    }
  }
}
