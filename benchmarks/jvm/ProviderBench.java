/*
 * In-JVM micro-benchmark of Spark StateStoreProviders (spark_state benchmarks, issue 5).
 *
 * The same code drives every provider through Spark's own StateStoreProvider API
 * (createAndInit -> getStore -> put/get/remove -> commit), so no Python call
 * overhead is measured. One JVM process runs one (provider, mode, size); the
 * Python driver (benchmarks/run.py) starts it and reads the single JSON line it
 * prints on stdout. Progress goes to stderr.
 *
 * Usage:
 *   java -cp <pyspark jars>:<shim jar>:<classes> ProviderBench \
 *        --provider-class CLASS --mode micro|memory|write|restore|write+restore|dedup \
 *        --rows N --dir /abs/checkpoint/dir [--batches B] [--change-pct P] \
 *        [--version V] [--conf key=value ...]
 */

import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.UUID;
import java.util.stream.Stream;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
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
import org.apache.spark.unsafe.types.UTF8String;

public final class ProviderBench {

    static final StructType BENCH_KEY = new StructType().add("k", DataTypes.LongType, false);
    static final StructType BENCH_VALUE = new StructType()
            .add("a", DataTypes.LongType, false)
            .add("b", DataTypes.LongType, false)
            .add("c", DataTypes.DoubleType, false)
            .add("d", DataTypes.IntegerType, false)
            .add("s", DataTypes.StringType, false);
    // --data sessions: what applyInPandasWithState keeps per user (its state struct plus the timeout
    // timestamp, as Spark stores flatMapGroupsWithState state): ids, counters, timestamps, short strings.
    static final StructType SESSIONS_KEY = new StructType().add("user", DataTypes.StringType, true);
    static final StructType SESSION_STATE = new StructType()
            .add("session_id", DataTypes.StringType, true)
            .add("clicks", DataTypes.LongType, true)
            .add("purchases", DataTypes.LongType, true)
            .add("first_seen", DataTypes.TimestampType, true)
            .add("last_seen", DataTypes.TimestampType, true)
            .add("last_page", DataTypes.StringType, true)
            .add("country", DataTypes.StringType, true);
    static final StructType SESSIONS_VALUE = new StructType()
            .add("groupState", SESSION_STATE, true)
            .add("timeoutTimestamp", DataTypes.LongType, false);
    static final String[] PAGES = {"/", "/home", "/cart", "/checkout", "/search", "/product/1042", "/product/77",
        "/product/310", "/account", "/help", "/category/shoes", "/category/books"};
    static final String[] COUNTRIES = {"US", "DE", "FR", "GB", "IN", "BR", "JP", "NL", "ES", "IT", "CA", "PL"};
    static final long EPOCH_US = 1_767_225_600_000_000L;   // 2026-01-01T00:00:00Z
    StructType KEY_SCHEMA = BENCH_KEY;
    StructType VALUE_SCHEMA = BENCH_VALUE;
    boolean sessions;
    org.apache.spark.sql.catalyst.expressions.UnsafeProjection keyProj;
    org.apache.spark.sql.catalyst.expressions.UnsafeProjection valueProj;
    static final String CF = StateStore.DEFAULT_COL_FAMILY_NAME();

    // ---------------------------------------------------------------- rows
    // Key: UnsafeRow(long) = 16 bytes. Value: UnsafeRow(long, long, double, int, string16) = 64 bytes.
    // Rows are written into a reused buffer, as Spark's projections do; providers must copy.
    final UnsafeRowWriter kw = new UnsafeRowWriter(1, 0);
    final UnsafeRowWriter vw = new UnsafeRowWriter(5, 32);
    static final UTF8String[] POOL = new UTF8String[1024];
    static {
        Random r = new Random(7);
        for (int i = 0; i < POOL.length; i++) {
            StringBuilder sb = new StringBuilder();
            for (int j = 0; j < 16; j++) sb.append((char) ('a' + r.nextInt(26)));
            POOL[i] = UTF8String.fromString(sb.toString());
        }
    }

    UnsafeRow key(long i) {
        if (sessions) {
            return keyProj.apply(new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(
                    new Object[] {UTF8String.fromString(String.format("user-%08d", i))}));
        }
        kw.reset();
        kw.zeroOutNullBytes();
        kw.write(0, i);
        return kw.getRow();
    }

    UnsafeRow sessionValue(long i, int gen) {
        long h = (i * 0x9E3779B97F4A7C15L) ^ gen;
        long first = EPOCH_US + (i % 86_400L) * 1_000_000L;
        long last = first + gen * 45_000_000L + (h & 0xFFFF) * 1000L;
        Object[] state = {
            UTF8String.fromString(Long.toHexString((h >>> 16) & 0xFFFFFFFFFFFL)),
            (long) (gen * 3 + (i % 7)), (long) ((i + gen) % 3 == 0 ? 1 : 0), first, last,
            UTF8String.fromString(PAGES[(int) ((i + gen) % PAGES.length)]),
            UTF8String.fromString(COUNTRIES[(int) (i % COUNTRIES.length)])};
        return valueProj.apply(new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(new Object[] {
            new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(state), last / 1000 + 1_800_000L}));
    }

    UnsafeRow value(long i, int gen) {
        if (sessions) {
            return sessionValue(i, gen);
        }
        vw.reset();
        vw.zeroOutNullBytes();
        vw.write(0, i);
        vw.write(1, i * 31 + gen);
        vw.write(2, i * 0.5);
        vw.write(3, gen);
        vw.write(4, POOL[(int) ((i + gen) & 1023)]);
        return vw.getRow();
    }

    void useData(String name) {
        if (name.equals("sessions")) {
            sessions = true;
            KEY_SCHEMA = SESSIONS_KEY;
            VALUE_SCHEMA = SESSIONS_VALUE;
            keyProj = org.apache.spark.sql.catalyst.expressions.UnsafeProjection.create(KEY_SCHEMA);
            valueProj = org.apache.spark.sql.catalyst.expressions.UnsafeProjection.create(VALUE_SCHEMA);
        } else if (!name.equals("bench")) {
            throw new IllegalArgumentException("--data bench|sessions, not " + name);
        }
    }

    // ---------------------------------------------------------------- args
    String providerClass;
    String mode = "micro";
    int rows = 10_000;
    String dir;
    int batches = 10;
    double changePct = 10.0;
    long version = -1;
    final Map<String, String> confs = new LinkedHashMap<>();
    int[] perm;

    // ---------------------------------------------------------------- provider plumbing
    SQLConf sqlConf() {
        SQLConf c = new SQLConf();
        c.setConfString("spark.sql.streaming.stateStore.providerClass", providerClass);
        for (Map.Entry<String, String> e : confs.entrySet()) c.setConfString(e.getKey(), e.getValue());
        return c;
    }

    @SuppressWarnings("unchecked")
    StateStoreConf storeConf() {
        scala.collection.immutable.Map<String, String> extra = scala.collection.immutable.Map$.MODULE$.empty();
        for (Map.Entry<String, String> e : confs.entrySet()) extra = extra.updated(e.getKey(), e.getValue());
        return new StateStoreConf(sqlConf(), extra);
    }

    StateStoreProvider newProvider(String checkpointDir) {
        StateStoreId id = new StateStoreId(new File(checkpointDir).toURI().toString(), 0L, 0, CF);
        // a fixed run id, as a restarted query keeps its own
        StateStoreProviderId pid = new StateStoreProviderId(id, new UUID(42, 42));
        return StateStoreProvider.createAndInit(pid, KEY_SCHEMA, VALUE_SCHEMA,
                new NoPrefixKeyStateEncoderSpec(KEY_SCHEMA), false, storeConf(), new Configuration(),
                false, scala.Option.empty());
    }

    static StateStore open(StateStoreProvider p, long v) {
        return p.getStore(v, scala.Option.empty(), false, false);
    }

    // ---------------------------------------------------------------- helpers
    static void log(String s) {
        System.err.println("[ProviderBench] " + s);
        System.err.flush();
    }

    static double median(double[] a) {
        double[] b = a.clone();
        java.util.Arrays.sort(b);
        return b.length % 2 == 1 ? b[b.length / 2] : (b[b.length / 2 - 1] + b[b.length / 2]) / 2;
    }

    static List<Double> toList(double[] a) {
        List<Double> l = new ArrayList<>();
        for (double d : a) l.add(d);
        return l;
    }

    static double ms(long ns) {
        return ns / 1e6;
    }

    long loadAll(StateStore s, int n, int gen) {
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) s.put(key(i), value(i, gen), CF);
        return System.nanoTime() - t0;
    }

    /** Writes `count` keys starting at offset `from` of the permutation (wrapping), with a new value generation. */
    long update(StateStore s, int from, int count, int gen) {
        int n = perm.length;
        long t0 = System.nanoTime();
        for (int j = 0; j < count; j++) {
            int i = perm[(from + j) % n];
            s.put(key(i), value(i, gen), CF);
        }
        return System.nanoTime() - t0;
    }

    /** Cost of building the key and value rows alone (subtracted from put/get/remove per-row times). */
    double rowBuildNsPerRow(int n, boolean withValue) {
        long sink = 0;
        long best = Long.MAX_VALUE;
        for (int rep = 0; rep < 3; rep++) {
            long t0 = System.nanoTime();
            for (int j = 0; j < n; j++) {
                int i = perm[j];
                sink += key(i).getSizeInBytes() + (withValue ? value(i, rep).getSizeInBytes() : 0);
            }
            best = Math.min(best, System.nanoTime() - t0);
        }
        if (sink == 42) log("");
        return (double) best / n;
    }

    static long[] dirUsage(Path root) throws IOException {
        if (!Files.exists(root)) return new long[] {0, 0};
        long[] acc = new long[2];
        try (Stream<Path> w = Files.walk(root)) {
            w.filter(Files::isRegularFile).forEach(p -> {
                try {
                    acc[0] += Files.size(p);
                    acc[1] += 1;
                } catch (IOException ignored) {
                }
            });
        }
        return acc;
    }

    static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) return;
        try (Stream<Path> w = Files.walk(root)) {
            w.sorted((a, b) -> b.getNameCount() - a.getNameCount()).forEach(p -> p.toFile().delete());
        }
    }

    static long rssBytes(long pid) {
        try {
            for (String line : Files.readAllLines(Paths.get("/proc/" + pid + "/status"))) {
                if (line.startsWith("VmRSS:")) {
                    String[] parts = line.trim().split("\\s+");
                    return Long.parseLong(parts[1]) * 1024L;
                }
            }
        } catch (IOException ignored) {
        }
        return 0;
    }

    static long childrenRss() {
        long[] acc = {0};
        ProcessHandle.current().descendants().forEach(ph -> acc[0] += rssBytes(ph.pid()));
        return acc[0];
    }

    /** CPU ticks (user + system) of this JVM's child processes (spark_state's worker) so far. */
    static long childrenCpuTicks() {
        long[] acc = {0};
        ProcessHandle.current().descendants().forEach(ph -> {
            try {
                String stat = new String(Files.readAllBytes(Paths.get("/proc/" + ph.pid() + "/stat")));
                String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
                acc[0] += Long.parseLong(f[11]) + Long.parseLong(f[12]);
            } catch (IOException | RuntimeException ignored) {
                // the process ended, or no /proc: counts as idle
            }
        });
        return acc[0];
    }

    static long heapUsedAfterGc() {
        MemoryMXBean mx = ManagementFactory.getMemoryMXBean();
        long last = Long.MAX_VALUE;
        for (int i = 0; i < 5; i++) {
            System.gc();
            try {
                Thread.sleep(100);
            } catch (InterruptedException ignored) {
            }
            long used = mx.getHeapMemoryUsage().getUsed();
            if (Math.abs(used - last) < 1 << 20) return used;
            last = used;
        }
        return last;
    }

    // ---------------------------------------------------------------- modes

    /** A small run in a throw-away directory so the JIT has compiled the hot paths of every provider alike. */
    void warmup() throws IOException {
        int n = Math.min(rows, 20_000);
        Path tmp = Files.createTempDirectory("ssbench-warmup");
        int[] saved = perm;
        perm = permutation(n, 3);
        StateStoreProvider p = newProvider(tmp.toString());
        try {
            long v = 0;
            for (int round = 0; round < 3; round++) {
                StateStore s = open(p, v);
                if (round == 0) loadAll(s, n, 0);
                else update(s, round * n / 10, n / 10, round);
                long sink = 0;
                for (int j = 0; j < n; j++) {
                    UnsafeRow r = s.get(key(perm[j]), CF);
                    if (r != null) sink += r.getSizeInBytes();
                }
                for (int j = 0; j < n / 20; j++) s.remove(key(perm[j]), CF);
                v = s.commit();
                if (sink == 42) log("");
            }
        } finally {
            p.close();
            deleteTree(tmp);
            perm = saved;
        }
    }

    static int[] permutation(int n, long seed) {
        int[] a = new int[n];
        for (int i = 0; i < n; i++) a[i] = i;
        Random r = new Random(seed);
        for (int i = n - 1; i > 0; i--) {
            int j = r.nextInt(i + 1);
            int t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        return a;
    }

    Map<String, Object> micro() throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        log("warm-up");
        warmup();
        double build = rowBuildNsPerRow(rows, true);
        double keyBuild = rowBuildNsPerRow(rows, false);
        out.put("row_build_ns", build);
        out.put("key_build_ns", keyBuild);
        StateStoreProvider p = newProvider(dir);
        try {
            // 1. insert every key into an empty store, commit version 1
            long t0 = System.nanoTime();
            StateStore s = open(p, 0);
            long openNs = System.nanoTime() - t0;
            log("put " + rows);
            long putNs = loadAll(s, rows, 0);
            t0 = System.nanoTime();
            long v = s.commit();
            long commitNs = System.nanoTime() - t0;
            out.put("open0_ms", ms(openNs));
            out.put("put_ns", Math.max(0.0, (double) putNs / rows - build));
            out.put("commit_initial_ms", ms(commitNs));

            // 2. versions with 1%, 10%, 100% of the keys changed. The 1% batch first reads every
            //    key in random order (what an aggregation does before it writes), timed apart.
            int gen = 1;
            int offset = 0;
            // 1% and 10% run three versions each (median reported), 100% runs once
            int[][] plan = {{1, 3}, {10, 3}, {100, 1}};
            boolean gotten = false;
            for (int[] step : plan) {
                int pct = step[0];
                int count = (int) Math.max(1, (long) rows * pct / 100);
                double[] os = new double[step[1]], us = new double[step[1]], cs = new double[step[1]], bs = new double[step[1]];
                for (int rep = 0; rep < step[1]; rep++) {
                    t0 = System.nanoTime();
                    s = open(p, v);
                    long o = System.nanoTime() - t0;
                    if (!gotten) {
                        gotten = true;
                        log("get " + rows);
                        long sink = 0;
                        int misses = 0;
                        t0 = System.nanoTime();
                        for (int j = 0; j < rows; j++) {
                            UnsafeRow r = s.get(key(perm[j]), CF);
                            if (r == null) misses++;
                            else sink += r.getLong(0);
                        }
                        long getNs = System.nanoTime() - t0;
                        out.put("get_ns", Math.max(0.0, (double) getNs / rows - keyBuild));
                        out.put("get_misses", misses);
                        if (sink == 42) log("");
                    }
                    log("update " + pct + "% (" + count + " rows) on version " + v);
                    long u = update(s, offset, count, gen++);
                    t0 = System.nanoTime();
                    v = s.commit();
                    long c = System.nanoTime() - t0;
                    offset += count;
                    os[rep] = ms(o);
                    us[rep] = Math.max(0.0, (double) u / count - build);
                    cs[rep] = ms(c);
                    bs[rep] = ms(o + u + c);
                }
                out.put("open_before_commit_" + pct + "pct_ms", median(os));
                out.put("update_" + pct + "pct_ns", median(us));
                out.put("commit_" + pct + "pct_ms", median(cs));
                out.put("batch_" + pct + "pct_ms", median(bs));
                out.put("commit_" + pct + "pct_all_ms", toList(cs));
            }

            // 3. remove 10% of the keys, per-row cost, then commit the deletions
            int count = Math.max(1, rows / 10);
            s = open(p, v);
            log("remove " + count);
            t0 = System.nanoTime();
            for (int j = 0; j < count; j++) s.remove(key(perm[j]), CF);
            long rmNs = System.nanoTime() - t0;
            t0 = System.nanoTime();
            v = s.commit();
            out.put("remove_ns", Math.max(0.0, (double) rmNs / count - keyBuild));
            out.put("commit_remove10pct_ms", ms(System.nanoTime() - t0));
            out.put("final_version", v);
        } finally {
            p.close();
        }
        return out;
    }

    Map<String, Object> memory() throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        long self = ProcessHandle.current().pid();
        // load classes, JIT, and (for spark_state) start the worker before taking the baseline
        warmup();
        long heap0 = heapUsedAfterGc();
        long rss0 = rssBytes(self);
        long committed0 = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getCommitted();
        long kids0 = childrenRss();
        StateStoreProvider p = newProvider(dir);
        StateStore s;
        try {
            s = open(p, 0);
            log("load " + rows + " rows");
            loadAll(s, rows, 0);
            long v = s.commit();
            long reported = s.metrics().memoryUsedBytes();
            long numKeys = s.metrics().numKeys();
            // what a running query holds between batches: the provider with the latest version loaded
            ReadStateStore rs = p.getReadStore(v, scala.Option.empty());
            long heap1 = heapUsedAfterGc();
            long rss1 = rssBytes(self);
            long committed1 = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getCommitted();
            long kids1 = childrenRss();
            out.put("heap_bytes_per_row", (double) (heap1 - heap0) / rows);
            // resident memory outside the Java heap (RocksDB's native memory, direct buffers, ...)
            out.put("offheap_bytes_per_row", (double) ((rss1 - rss0) - Math.max(0, committed1 - committed0)) / rows);
            // child processes of this JVM (spark_state's Python worker)
            out.put("child_rss_bytes_per_row", (double) (kids1 - kids0) / rows);
            out.put("reported_bytes_per_row", (double) reported / rows);
            out.put("num_keys", numKeys);
            rs.release();
        } finally {
            p.close();
        }
        return out;
    }

    /** B batches: load every key (batch 1), then B-1 batches changing changePct% of the keys each. */
    Map<String, Object> write() throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        warmup();
        StateStoreProvider p = newProvider(dir);
        List<Double> commits = new ArrayList<>();
        long v;
        try {
            StateStore s = open(p, 0);
            log("write batch 1/" + batches + " (" + rows + " rows)");
            loadAll(s, rows, 0);
            long t0 = System.nanoTime();
            v = s.commit();
            commits.add(ms(System.nanoTime() - t0));
            int count = (int) Math.max(1, Math.round(rows * changePct / 100.0));
            int offset = 0;
            for (int b = 2; b <= batches; b++) {
                s = open(p, v);
                update(s, offset, count, b);
                offset += count;
                t0 = System.nanoTime();
                v = s.commit();
                commits.add(ms(System.nanoTime() - t0));
            }
            log("maintenance");
            t0 = System.nanoTime();
            p.doMaintenance();
            out.put("maintenance_ms", ms(System.nanoTime() - t0));
        } finally {
            p.close();
        }
        // background work (spark_state's snapshot compaction in its worker, which computes for many
        // seconds before it writes) may still be running: count once neither the directory nor the child
        // processes' CPU time changed for 3 s (at most 600 s), as a query running on would have its
        // maintenance done before a later restart
        long[] usage = dirUsage(Paths.get(dir));
        long cpu = childrenCpuTicks();
        for (int i = 0, quiet = 0; i < 2400 && quiet < 12; i++) {
            try {
                Thread.sleep(250);
            } catch (InterruptedException ignored) {
            }
            long[] again = dirUsage(Paths.get(dir));
            long cpuAgain = childrenCpuTicks();
            quiet = again[0] == usage[0] && again[1] == usage[1] && cpuAgain - cpu <= 2 ? quiet + 1 : 0;
            usage = again;
            cpu = cpuAgain;
        }
        out.put("version", v);
        out.put("batches", batches);
        out.put("change_pct", changePct);
        out.put("commit_ms", commits);
        out.put("checkpoint_bytes", usage[0]);
        out.put("checkpoint_files", usage[1]);
        out.put("checkpoint_bytes_per_row", (double) usage[0] / rows);
        return out;
    }

    /** Opens version `version` on a fresh provider instance (in a fresh JVM unless mode is write+restore). */
    Map<String, Object> restore(long v, boolean warm) throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        // classes loaded and JIT warm, as in an executor that already ran other tasks; the state
        // itself comes from storage (new JVM: nothing of it is cached in this process)
        if (warm) warmup();
        long heap0 = heapUsedAfterGc();
        long t0 = System.nanoTime();
        StateStoreProvider p = newProvider(dir);
        long initNs = System.nanoTime() - t0;
        try {
            t0 = System.nanoTime();
            ReadStateStore s = p.getReadStore(v, scala.Option.empty());
            long openNs = System.nanoTime() - t0;
            // touch one key so lazily-loading providers really have the version
            UnsafeRow r = s.get(key(rows / 2), CF);
            long firstGetNs = System.nanoTime() - t0 - openNs;
            out.put("restore_ms", ms(openNs));
            out.put("init_ms", ms(initNs));
            out.put("first_get_ms", ms(firstGetNs));
            // what the restored version holds on the heap before any batch touches it
            out.put("restore_heap_bytes_per_row", (double) (heapUsedAfterGc() - heap0) / rows);
            long keys = 0;
            t0 = System.nanoTime();
            scala.collection.Iterator<UnsafeRowPair> it = s.iterator(CF);
            while (it.hasNext()) {
                it.next();
                keys++;
            }
            out.put("iterate_ms", ms(System.nanoTime() - t0));
            out.put("num_keys", keys);
            out.put("found", r != null);
            s.release();
            // the first batch after the restore: an aggregation's get + put of 1% of the keys, then commit
            int count = (int) Math.max(1, rows / 100);
            t0 = System.nanoTime();
            StateStore w = open(p, v);
            for (int j = 0; j < count; j++) {
                int i = perm[j];
                UnsafeRow old = w.get(key(i), CF);
                if (old == null) throw new IllegalStateException("key " + i + " missing after restore");
                w.put(key(i), value(i, 99), CF);
            }
            w.commit();
            out.put("batch_1pct_after_restore_ms", ms(System.nanoTime() - t0));
            out.put("batch_heap_bytes_per_row", (double) (heapUsedAfterGc() - heap0) / rows);
        } finally {
            p.close();
        }
        return out;
    }

    /**
     * A deduplication batch after a restart (issue 37): version `v` (written by mode write) restored on a fresh
     * provider, then `rows / 10` incoming keys, half of them in the state, each looked up the way Spark 4.2+'s
     * dropDuplicates does: "before" is Spark's default keyExists, {@code get(key) != null}; "after" is the
     * provider's own {@code keyExists}; "multiget" looks the batch up with {@code multiGet} in chunks of 1024.
     * Each variant runs on its own fresh restore (no block cached yet), twice, alternating; medians reported.
     * "open" is the first get of a key beyond the state on each fresh restore (what opening the restored state
     * costs: the load, the image's index and key filter), timed apart from the lookups; "warm" repeats the
     * keyExists lookups on the same store (every block they need read once already).
     */
    Map<String, Object> dedup(long v) throws IOException {
        warmup();
        Map<String, Object> out = new LinkedHashMap<>();
        int count = Math.max(2, rows / 10);
        UnsafeRow[] keys = new UnsafeRow[count];
        for (int j = 0; j < count; j++) {
            // even j: a key of the state (spread over all of it); odd j: a key beyond it (absent)
            long i = j % 2 == 0 ? perm[j % perm.length] : rows + (long) j;
            keys[j] = key(i).copy();
        }
        String[] variants = {"before", "after", "multiget"};
        Map<String, double[]> times = new LinkedHashMap<>();
        for (String variant : variants) times.put(variant, new double[2]);
        double[] opens = new double[2 * variants.length];
        double[] warm = new double[2];
        UnsafeRow probe = key(rows + (long) count + 1).copy();
        long found = -1;
        for (int rep = 0; rep < 2; rep++) {
            for (String variant : variants) {
                StateStoreProvider p = newProvider(dir);
                try {
                    ReadStateStore s = p.getReadStore(v, scala.Option.empty());
                    long hits = 0;
                    long o0 = System.nanoTime();
                    if (s.get(probe, CF) != null) throw new IllegalStateException("a key beyond the state was found");
                    opens[rep * variants.length + java.util.Arrays.asList(variants).indexOf(variant)] =
                            ms(System.nanoTime() - o0);
                    long t0 = System.nanoTime();
                    if (variant.equals("multiget")) {
                        for (int from = 0; from < count; from += 1024) {
                            UnsafeRow[] chunk = java.util.Arrays.copyOfRange(keys, from, Math.min(count, from + 1024));
                            scala.collection.Iterator<UnsafeRow> it = s.multiGet(chunk, CF);
                            while (it.hasNext()) if (it.next() != null) hits++;
                        }
                    } else if (variant.equals("after")) {
                        for (UnsafeRow k : keys) if (s.keyExists(k, CF)) hits++;
                    } else {
                        for (UnsafeRow k : keys) if (s.get(k, CF) != null) hits++;
                    }
                    times.get(variant)[rep] = ms(System.nanoTime() - t0);
                    if (variant.equals("after")) {
                        long w0 = System.nanoTime();
                        long again = 0;
                        for (UnsafeRow k : keys) if (s.keyExists(k, CF)) again++;
                        warm[rep] = ms(System.nanoTime() - w0);
                        if (again != hits) throw new IllegalStateException("keyExists found " + again + ", then " + hits);
                    }
                    if (found >= 0 && found != hits) throw new IllegalStateException(variant + " found " + hits
                            + " keys, another variant " + found);
                    found = hits;
                    s.release();
                } finally {
                    p.close();
                }
            }
        }
        out.put("version", v);
        out.put("lookups", count);
        out.put("found", found);
        out.put("open_ms", median(opens));
        out.put("warm_ms", median(warm));
        for (String variant : variants) {
            out.put(variant + "_ms", median(times.get(variant)));
            out.put(variant + "_runs_ms", toList(times.get(variant)));
        }
        return out;
    }

    // ---------------------------------------------------------------- JSON (no library needed)
    static void json(StringBuilder sb, Object o) {
        if (o == null) sb.append("null");
        else if (o instanceof String) {
            sb.append('"');
            for (char c : ((String) o).toCharArray()) {
                if (c == '"' || c == '\\') sb.append('\\').append(c);
                else if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
                else sb.append(c);
            }
            sb.append('"');
        } else if (o instanceof Double || o instanceof Float) {
            double d = ((Number) o).doubleValue();
            sb.append(Double.isFinite(d) ? Double.toString(d) : "null");
        } else if (o instanceof Number || o instanceof Boolean) sb.append(o);
        else if (o instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (!first) sb.append(',');
                first = false;
                json(sb, String.valueOf(e.getKey()));
                sb.append(':');
                json(sb, e.getValue());
            }
            sb.append('}');
        } else if (o instanceof List) {
            sb.append('[');
            boolean first = true;
            for (Object x : (List<?>) o) {
                if (!first) sb.append(',');
                first = false;
                json(sb, x);
            }
            sb.append(']');
        } else json(sb, o.toString());
    }

    public static void main(String[] args) throws Exception {
        ProviderBench b = new ProviderBench();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            switch (a) {
                case "--provider-class": b.providerClass = args[++i]; break;
                case "--mode": b.mode = args[++i]; break;
                case "--rows": b.rows = Integer.parseInt(args[++i]); break;
                case "--data": b.useData(args[++i]); break;
                case "--dir": b.dir = args[++i]; break;
                case "--batches": b.batches = Integer.parseInt(args[++i]); break;
                case "--change-pct": b.changePct = Double.parseDouble(args[++i]); break;
                case "--version": b.version = Long.parseLong(args[++i]); break;
                case "--conf": {
                    String kv = args[++i];
                    int eq = kv.indexOf('=');
                    b.confs.put(kv.substring(0, eq), kv.substring(eq + 1));
                    break;
                }
                default: throw new IllegalArgumentException("unknown argument " + a);
            }
        }
        if (b.providerClass == null || b.dir == null) throw new IllegalArgumentException("--provider-class and --dir are required");
        b.perm = permutation(b.rows, 1);
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("provider_class", b.providerClass);
        result.put("mode", b.mode);
        result.put("rows", b.rows);
        long t0 = System.nanoTime();
        switch (b.mode) {
            case "micro": result.putAll(b.micro()); break;
            case "memory": result.putAll(b.memory()); break;
            case "write": result.putAll(b.write()); break;
            case "restore": result.putAll(b.restore(b.version, true)); break;
            case "dedup": result.putAll(b.dedup(b.version)); break;
            case "write+restore": {
                Map<String, Object> w = b.write();
                result.putAll(w);
                result.putAll(b.restore(((Number) w.get("version")).longValue(), false));
                result.put("restore_same_jvm", true);
                break;
            }
            default: throw new IllegalArgumentException("unknown mode " + b.mode);
        }
        result.put("wall_ms", ms(System.nanoTime() - t0));
        result.put("max_heap_bytes", Runtime.getRuntime().maxMemory());
        StringBuilder sb = new StringBuilder("RESULT ");
        json(sb, result);
        System.out.println(sb);
        System.out.flush();
        // Spark/RocksDB may leave non-daemon threads behind
        System.exit(0);
    }
}
