package io.sparkstate.shim.engine;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Drives RowImageWriter, RowImage and BlockCache from stdin for tests/test_rowimage_jvm.py, one command
 * a line. Keys are UnsafeRows of one string column, values of one binary column (Spark's projections
 * build them), given as the hex of the column's bytes ("-" is empty). Errors answer "ERR message".
 * <pre>
 *   write PATH BLOCKBYTES zstd|raw sorted|unsorted N   then N lines "KG HASH KEY VALUE|~" (~ a tombstone)
 *                                      → OK bytes
 *   open PATH VERIFY(0|1) CACHEBYTES   → OK rows blocks   (a new cache of that size; closes the last image)
 *   get KG HASH KEY [KG HASH KEY ...]  → per key: the value, DELETED or NULL, space-separated
 *   scan                               → "R KG HASH KEY VALUE|~" per record, then END
 *   held                               → OK, or BAD: a value handed out by get whose bytes changed since
 *   cache                              → USED BLOCKS CAPACITY
 *   race THREADS GETS                  → OK, or BAD and what: threads get the last written records at random
 *   close                              → OK
 * </pre>
 */
public class RowImageProbe {
  static final StructType KEY = new StructType().add("k", DataTypes.StringType, false);
  static final StructType VALUE = new StructType().add("v", DataTypes.BinaryType, false);
  static final ThreadLocal<UnsafeProjection> KEYS = ThreadLocal.withInitial(() -> UnsafeProjection.create(KEY));
  static final ThreadLocal<UnsafeProjection> VALUES = ThreadLocal.withInitial(() -> UnsafeProjection.create(VALUE));

  static byte[] unhex(String s) {
    return s.equals("-") ? new byte[0] : HexFormat.of().parseHex(s);
  }

  static String hex(byte[] b) {
    return b.length == 0 ? "-" : HexFormat.of().formatHex(b);
  }

  static UnsafeRow key(String h) {
    return KEYS.get().apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(unhex(h))})).copy();
  }

  static UnsafeRow value(String h) {
    return VALUES.get().apply(new GenericInternalRow(new Object[] {unhex(h)})).copy();
  }

  static String showValue(UnsafeRow v) {
    return v == null ? "NULL" : v == RowImage.DELETED ? "DELETED" : hex(v.getBinary(0));
  }

  static RowImage image;
  static BlockCache cache;
  static final List<UnsafeRow> HELD = new ArrayList<>();
  static final List<String> HELD_TEXT = new ArrayList<>();
  /** The records of the last write: key hex → "KG HASH VALUE|~". */
  static final Map<String, String[]> WRITTEN = new HashMap<>();

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, false, "UTF-8");
    String line;
    while ((line = in.readLine()) != null) {
      String[] a = line.split(" ");
      try {
        switch (a[0]) {
          case "write":
            out.println(write(in, a));
            break;
          case "open":
            if (image != null) {
              image.close();
            }
            image = null;
            HELD.clear();
            HELD_TEXT.clear();
            cache = new BlockCache(Long.parseLong(a[3]));
            image = RowImage.open(Paths.get(a[1]), KEY.fields().length, VALUE.fields().length, cache, a[2].equals("1"));
            out.println("OK " + image.rows() + " " + image.blockCount());
            break;
          case "get": {
            StringBuilder sb = new StringBuilder();
            for (int i = 1; i + 2 < a.length; i += 3) {
              UnsafeRow v = image.get(Integer.parseInt(a[i]), Integer.parseInt(a[i + 1]), key(a[i + 2]));
              if (v != null && v != RowImage.DELETED) {
                HELD.add(v);
                HELD_TEXT.add(showValue(v));
              }
              sb.append(i > 1 ? " " : "").append(showValue(v));
            }
            out.println(sb);
            break;
          }
          case "scan": {
            RowImage.Cursor c = image.cursor();
            while (c.next()) {
              UnsafeRow v = c.value();
              out.println("R " + c.keyGroup() + " " + c.hash() + " " + hex(c.key().getUTF8String(0).getBytes()) + " "
                  + (c.deleted() ? "~" : hex(v.getBinary(0))));
            }
            out.println("END");
            break;
          }
          case "held": {
            String bad = null;
            for (int j = 0; j < HELD.size() && bad == null; j++) {
              if (!showValue(HELD.get(j)).equals(HELD_TEXT.get(j))) {
                bad = HELD_TEXT.get(j) + " became " + showValue(HELD.get(j));
              }
            }
            out.println(bad == null ? "OK" : "BAD " + bad);
            break;
          }
          case "positions": {   // positions HASH K BITS: the key filter's bit positions (docs/row-image.md)
            long[] bits = KeyFilter.positions(Integer.parseInt(a[1]), Integer.parseInt(a[2]), Long.parseLong(a[3]));
            StringBuilder sb = new StringBuilder("OK");
            for (long b : bits) {
              sb.append(' ').append(Long.toUnsignedString(b));
            }
            out.println(sb);
            break;
          }
          case "filter": {   // how many of N random hashes (absent, all but by chance) pass the key filter
            java.util.Random random = new java.util.Random(Long.parseLong(a[2]));
            int passed = 0;
            for (int i = 0; i < Integer.parseInt(a[1]); i++) {
              passed += image.mightContain(random.nextInt()) ? 1 : 0;
            }
            out.println("OK " + passed);
            break;
          }
          case "cache":
            out.println(cache.usedBytes() + " " + cache.blockCount() + " " + cache.capacity());
            break;
          case "race":
            out.println(race(Integer.parseInt(a[1]), Integer.parseInt(a[2])));
            break;
          case "close":
            if (image != null) {
              image.close();
            }
            image = null;
            out.println("OK");
            break;
          default:
            out.println("ERR unknown command " + a[0]);
        }
      } catch (Exception e) {
        out.println("ERR " + e.getClass().getSimpleName() + ": " + e.getMessage());
      }
      out.flush();
    }
  }

  static String write(BufferedReader in, String[] a) throws Exception {
    int n = Integer.parseInt(a[5]);
    int[] keyGroups = new int[n];
    int[] hashes = new int[n];
    UnsafeRow[] keys = new UnsafeRow[n];
    UnsafeRow[] values = new UnsafeRow[n];
    WRITTEN.clear();
    for (int i = 0; i < n; i++) {
      String[] r = in.readLine().split(" ");
      keyGroups[i] = Integer.parseInt(r[0]);
      hashes[i] = Integer.parseInt(r[1]);
      keys[i] = key(r[2]);
      values[i] = r[3].equals("~") ? null : value(r[3]);
      WRITTEN.put(r[2], r);
    }
    // a key filter sized for the records, unless the command says "nofilter" (a sixth word)
    long expected = a.length > 5 && a[5].equals("nofilter") ? -1 : n;
    try (RowImageWriter w = new RowImageWriter(Paths.get(a[1]), Integer.parseInt(a[2]), a[3].equals("zstd"), expected)) {
      if (a[4].equals("sorted")) {
        for (int i = 0; i < n; i++) {
          w.add(keyGroups[i], hashes[i], keys[i], values[i]);
        }
      } else {
        w.addUnsorted(n, keyGroups, hashes, keys, values);
      }
      return "OK " + w.finish();
    }
  }

  /** Threads get the last written records (found by their key, right value or DELETED) over a shared cache. */
  static String race(int threads, int gets) throws Exception {
    List<String[]> records = new ArrayList<>(WRITTEN.values());
    AtomicReference<String> bad = new AtomicReference<>();
    AtomicLong found = new AtomicLong();
    List<Thread> all = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      final int seed = t;
      Thread thread = new Thread(() -> {
        Random rnd = new Random(seed);
        List<UnsafeRow> kept = new ArrayList<>();
        List<String> keptText = new ArrayList<>();
        try {
          for (int i = 0; i < gets && bad.get() == null; i++) {
            String[] r = records.get(rnd.nextInt(records.size()));
            UnsafeRow v = image.get(Integer.parseInt(r[0]), Integer.parseInt(r[1]), key(r[2]));
            String want = r[3].equals("~") ? "DELETED" : r[3];
            if (!showValue(v).equals(want)) {
              bad.compareAndSet(null, r[2] + " gave " + showValue(v) + ", not " + want);
            }
            if (v != RowImage.DELETED && kept.size() < 1000) {
              kept.add(v);
              keptText.add(want);
            }
            found.incrementAndGet();
          }
          for (int j = 0; j < kept.size(); j++) {
            if (!showValue(kept.get(j)).equals(keptText.get(j))) {
              bad.compareAndSet(null, "a kept row changed: " + keptText.get(j));
            }
          }
        } catch (RuntimeException e) {
          bad.compareAndSet(null, e.toString());
        }
      });
      all.add(thread);
      thread.start();
    }
    for (Thread thread : all) {
      thread.join();
    }
    if (bad.get() != null) {
      return "BAD " + bad.get();
    }
    if (cache.usedBytes() > cache.capacity()) {
      return "BAD the cache holds " + cache.usedBytes() + " bytes, more than its " + cache.capacity();
    }
    return "OK " + found.get();
  }
}
