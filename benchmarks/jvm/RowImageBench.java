/*
 * In-JVM micro-benchmark of row images (issue 23): RowImageWriter, RowImage and BlockCache on the
 * benchmark rows of ProviderBench (key UnsafeRow(long), value UnsafeRow(long, long, double, int,
 * string16)), beside RowArena.get on the same rows in the same JVM. No JMH: warm-up passes, then
 * System.nanoTime around batches (single gets for the cold ones). Progress on stderr, one RESULT JSON
 * line on stdout. Driven by benchmarks/rowimage.py (compiles this file into the shim's package).
 *
 *   java -Xmx6g -cp <classes>:<shim jar>:<pyspark jars>/* io.sparkstate.shim.engine.RowImageBench \
 *        --rows N --dir DIR [--block-bytes 4096] [--cache-mb 64] [--cold 1000] [--warm 1000000]
 */
package io.sparkstate.shim.engine;

import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;

import io.sparkstate.shim.codec.KeyHasher;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

public final class RowImageBench {
  static final StructType KEY = new StructType().add("k", DataTypes.LongType, false);
  static final int VALUE_FIELDS = 5;
  static final int MAX_PARALLELISM = 100_800;   // spark_state's default maxParallelism
  static final UTF8String[] POOL = new UTF8String[1024];

  static {
    Random r = new Random(7);
    for (int i = 0; i < POOL.length; i++) {
      StringBuilder sb = new StringBuilder();
      for (int j = 0; j < 16; j++) {
        sb.append((char) ('a' + r.nextInt(26)));
      }
      POOL[i] = UTF8String.fromString(sb.toString());
    }
  }

  final UnsafeRowWriter kw = new UnsafeRowWriter(1, 0);
  final UnsafeRowWriter vw = new UnsafeRowWriter(5, 32);
  final Map<String, Object> result = new LinkedHashMap<>();
  long sink;

  /** ProviderBench.key: written into a reused buffer, as Spark's projections do. */
  UnsafeRow key(long i) {
    kw.reset();
    kw.zeroOutNullBytes();
    kw.write(0, i);
    return kw.getRow();
  }

  /** ProviderBench.value(i, 0). */
  UnsafeRow value(long i) {
    vw.reset();
    vw.zeroOutNullBytes();
    vw.write(0, i);
    vw.write(1, i * 31);
    vw.write(2, i * 0.5);
    vw.write(3, 0);
    vw.write(4, POOL[(int) (i & 1023)]);
    return vw.getRow();
  }

  static long heapUsed() {
    for (int i = 0; i < 3; i++) {
      System.gc();
    }
    return ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
  }

  static void log(String s) {
    System.err.println("[RowImageBench] " + s);
  }

  void put(String name, Object value) {
    result.put(name, value);
    log(name + " = " + value);
  }

  static double round(double x, int digits) {
    double f = Math.pow(10, digits);
    return Math.round(x * f) / f;
  }

  public static void main(String[] args) throws Exception {
    int rows = 1_000_000;
    Path dir = null;
    int blockBytes = RowImageWriter.DEFAULT_BLOCK_BYTES;
    long cacheBytes = 64L << 20;
    int cold = 1000;
    int warm = 1_000_000;
    for (int i = 0; i < args.length; i += 2) {
      switch (args[i]) {
        case "--rows": rows = Integer.parseInt(args[i + 1]); break;
        case "--dir": dir = Paths.get(args[i + 1]); break;
        case "--block-bytes": blockBytes = Integer.parseInt(args[i + 1]); break;
        case "--cache-mb": cacheBytes = Long.parseLong(args[i + 1]) << 20; break;
        case "--cold": cold = Integer.parseInt(args[i + 1]); break;
        case "--warm": warm = Integer.parseInt(args[i + 1]); break;
        default: throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    Files.createDirectories(dir);
    new RowImageBench().run(rows, dir.resolve("bench-" + rows + ".rimg"), blockBytes, cacheBytes, cold, warm);
  }

  void run(int n, Path path, int blockBytes, long cacheBytes, int cold, int warm) throws Exception {
    put("rows", n);
    put("block_bytes", blockBytes);
    put("cache_bytes", cacheBytes);
    KeyHasher hasher = new KeyHasher(KEY, 1, MAX_PARALLELISM);

    // Spark's hash of every key (the store needs it for key groups) and the sort.
    int[] hashes = new int[n];
    long t = System.nanoTime();
    for (int i = 0; i < n; i++) {
      hashes[i] = hasher.hash(key(i));
    }
    put("hash_ns_per_row", round((System.nanoTime() - t) / (double) n, 1));
    long[] sortKeys = new long[n];
    for (int i = 0; i < n; i++) {
      sortKeys[i] = RowImage.sortKey(hasher.keyGroup(hashes[i]), hashes[i]);
    }
    t = System.nanoTime();
    int[] order = RowImageWriter.sortedPositions(sortKeys);
    put("sort_s", round((System.nanoTime() - t) / 1e9, 3));
    sortKeys = null;

    // Write (rows already in sort order: the writer's own cost).
    t = System.nanoTime();
    try (RowImageWriter w = new RowImageWriter(path, blockBytes, true)) {
      for (int i : order) {
        w.add(hasher.keyGroup(hashes[i]), hashes[i], key(i), value(i));
      }
      put("file_bytes", w.finish());
    }
    double writeS = (System.nanoTime() - t) / 1e9;
    put("write_s", round(writeS, 3));
    put("write_rows_per_s", Math.round(n / writeS));
    put("file_bytes_per_row", round(Files.size(path) / (double) n, 2));
    put("raw_bytes_per_row", 16 + 16 + 64);
    order = null;

    // Open: trailer and index only; the heap it keeps.
    long[] opens = new long[5];
    for (int i = 0; i < opens.length; i++) {
      long t0 = System.nanoTime();
      RowImage.open(path, 1, VALUE_FIELDS, new BlockCache(0), false).close();
      opens[i] = System.nanoTime() - t0;
    }
    Arrays.sort(opens);
    put("open_ms_median_of_5", round(opens[2] / 1e6, 2));
    long before = heapUsed();
    BlockCache cache = new BlockCache(cacheBytes);
    RowImage image = RowImage.open(path, 1, VALUE_FIELDS, cache, false);
    long after = heapUsed();
    put("blocks", image.blockCount());
    put("open_image_heap_bytes", after - before);
    put("open_image_heap_bytes_per_row", round((after - before) / (double) n, 3));
    put("open_image_heap_bytes_per_row_computed", round(image.heapBytes() / (double) n, 3));

    Random rnd = new Random(42);
    long[] ids = new long[Math.max(cold, warm)];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = rnd.nextInt(n);
    }

    // JIT warm-up of the whole get path (misses included) on another image and cache.
    try (RowImage other = RowImage.open(path, 1, VALUE_FIELDS, new BlockCache(cacheBytes / 16), false)) {
      getsRowImage(other, hasher, hashes, ids, warm / 5);
    }

    // Cold: a fresh cache, each get timed alone (the OS page cache holds the file: no disk read).
    long[] lat = new long[cold];
    for (int i = 0; i < cold; i++) {
      int id = (int) ids[i];
      UnsafeRow k = key(id);
      long t0 = System.nanoTime();
      UnsafeRow v = image.get(hasher.keyGroup(hashes[id]), hashes[id], k);
      lat[i] = System.nanoTime() - t0;
      check(v, id);
    }
    percentiles("cold_get", lat);
    put("cold_get_block_loads", cache.loads());

    // Warm: the same cache after a warm-up pass over as many random gets.
    getsRowImage(image, hasher, hashes, ids, warm);
    long loads = cache.loads();
    double ns = getsRowImage(image, hasher, hashes, ids, warm);
    put("warm_get_ns", round(ns, 1));
    put("warm_get_hit_rate", round(1 - (cache.loads() - loads) / (double) warm, 4));
    put("warm_cache_used_bytes", cache.usedBytes());

    // Everything cached (what a store whose rows fit its budget pays), for the comparison with the arena.
    cache.setCapacity(Long.MAX_VALUE);
    getsRowImage(image, hasher, hashes, ids, warm);
    getsRowImage(image, hasher, hashes, ids, warm);
    loads = cache.loads();
    put("all_cached_get_ns", round(getsRowImage(image, hasher, hashes, ids, warm), 1));
    put("all_cached_hit_rate", round(1 - (cache.loads() - loads) / (double) warm, 4));
    put("all_cached_cache_bytes_per_row", round(cache.usedBytes() / (double) n, 1));
    image.close();

    // Spark's hash of a key, what a lookup through images adds when the caller has no hash yet.
    t = System.nanoTime();
    for (int i = 0; i < warm; i++) {
      sink += hasher.hash(key(ids[i]));
    }
    put("hash_one_key_ns", round((System.nanoTime() - t) / (double) warm, 1));

    // Full iteration with a fresh cache (the cursor reads and decompresses every block itself).
    image = RowImage.open(path, 1, VALUE_FIELDS, new BlockCache(cacheBytes), false);
    for (int pass = 0; pass < 2; pass++) {
      t = System.nanoTime();
      long count = 0;
      RowImage.Cursor c = image.cursor();
      while (c.next()) {
        sink += c.key().getLong(0) + c.value().getLong(0);
        count++;
      }
      double s = (System.nanoTime() - t) / 1e9;
      if (count != n) {
        throw new IllegalStateException("the cursor saw " + count + " rows of " + n);
      }
      put("iterate_rows_per_s" + (pass == 0 ? "_first" : ""), Math.round(n / s));
    }
    image.close();

    // RowArena on the same rows, the same gets.
    before = heapUsed();
    RowArena arena = new RowArena(1, VALUE_FIELDS, n);
    t = System.nanoTime();
    for (int i = 0; i < n; i++) {
      arena.put(key(i), value(i));
    }
    put("arena_put_s", round((System.nanoTime() - t) / 1e9, 3));
    after = heapUsed();
    put("arena_heap_bytes_per_row", round((after - before) / (double) n, 1));
    getsArena(arena, ids, warm);
    getsArena(arena, ids, warm);
    put("arena_get_ns", round(getsArena(arena, ids, warm), 1));
    put("sink", sink);
    System.out.println("RESULT " + toJson(result));
  }

  static void check(UnsafeRow v, long id) {
    if (v == null || v == RowImage.DELETED || v.getLong(0) != id) {
      throw new IllegalStateException("wrong value for key " + id);
    }
  }

  /** Mean ns of {@code count} gets of ids[0..count) through the image (hash precomputed, as a store caches it). */
  double getsRowImage(RowImage image, KeyHasher hasher, int[] hashes, long[] ids, int count) {
    long t = System.nanoTime();
    for (int i = 0; i < count; i++) {
      int id = (int) ids[i];
      UnsafeRow v = image.get(hasher.keyGroup(hashes[id]), hashes[id], key(id));
      sink += v.getLong(0);
    }
    return (System.nanoTime() - t) / (double) count;
  }

  double getsArena(RowArena arena, long[] ids, int count) {
    long t = System.nanoTime();
    for (int i = 0; i < count; i++) {
      UnsafeRow v = arena.get(key(ids[i]));
      sink += v.getLong(0);
    }
    return (System.nanoTime() - t) / (double) count;
  }

  void percentiles(String name, long[] lat) {
    long[] s = lat.clone();
    Arrays.sort(s);
    put(name + "_us_p50", round(s[s.length / 2] / 1e3, 2));
    put(name + "_us_p99", round(s[(int) (s.length * 0.99)] / 1e3, 2));
    put(name + "_us_mean", round(Arrays.stream(s).average().orElse(0) / 1e3, 2));
  }

  static String toJson(Map<String, Object> m) {
    StringBuilder sb = new StringBuilder("{");
    for (Map.Entry<String, Object> e : m.entrySet()) {
      if (sb.length() > 1) {
        sb.append(", ");
      }
      sb.append('"').append(e.getKey()).append("\": ").append(e.getValue());
    }
    return sb.append('}').toString();
  }
}
