package io.sparkstate.shim.engine;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;

import io.sparkstate.shim.codec.KeyHasher;
import io.sparkstate.shim.memory.MemoryBudget;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Drives a StateMap (arena-backed) from stdin for tests/test_state_map.py, one command a line, byte
 * strings in hex ("-" is the empty string):
 * <pre>
 *   reset N               → OK N      (a new, empty map)
 *   put K V               → old value or NULL
 *   get K                 → value or NULL (the row is kept: see "held")
 *   remove K              → old value or NULL
 *   size                  → n
 *   iter A1 A2 ...        → "V K V" per row visited, then END; after the i-th row, action Ai runs:
 *                           "." nothing, "r" remove that key, "u:V" put that key with V,
 *                           "d:K" remove K, "p:K:V" put K with V
 *   held                  → OK, or BAD and the first row handed out by get whose bytes changed since
 *   race KEYS OPS         → OK, or BAD and what went wrong: one thread puts and removes OPS times over
 *                           KEYS keys while two others get and iterate (see {@link #race})
 * </pre>
 */
public class ArenaProbe {
  static final StructType KEY = new StructType().add("k", DataTypes.StringType, false);
  static final StructType VALUE = new StructType().add("v", DataTypes.StringType, false).add("n", DataTypes.LongType, false);
  /** Per thread: a projection reuses its output row (the race command builds rows on three threads). */
  static final ThreadLocal<UnsafeProjection> KEYS = ThreadLocal.withInitial(() -> UnsafeProjection.create(KEY));
  static final ThreadLocal<UnsafeProjection> VALUES = ThreadLocal.withInitial(() -> UnsafeProjection.create(VALUE));

  static byte[] unhex(String s) {
    if (s.equals("-")) {
      return new byte[0];
    }
    byte[] b = new byte[s.length() / 2];
    for (int i = 0; i < b.length; i++) {
      b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
    }
    return b;
  }

  static String hex(byte[] b) {
    if (b.length == 0) {
      return "-";
    }
    StringBuilder sb = new StringBuilder();
    for (byte x : b) {
      sb.append(String.format("%02x", x));
    }
    return sb.toString();
  }

  static UnsafeRow key(String h) {
    return KEYS.get().apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(unhex(h))})).copy();
  }

  static UnsafeRow value(String h) {
    byte[] b = unhex(h);
    return VALUES.get().apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(b), (long) b.length})).copy();
  }

  static String show(UnsafeRow row) {
    return hex(row.getUTF8String(0).getBytes());
  }

  static String showOrNull(UnsafeRow value) {
    if (value == null) {
      return "NULL";
    }
    if (value.getLong(1) != value.getUTF8String(0).numBytes()) {
      return "CORRUPT";
    }
    return show(value);
  }

  /**
   * The map under test: a {@link LayeredMap}, whose budget ({@code -Dprobe.budget} bytes) the "layered"
   * tests make small enough that puts spill to runs (the "arena" ones leave it large: the heap rows alone).
   */
  static StateMap newMap() {
    KeyHasher hasher = new KeyHasher(KEY, 1, Integer.getInteger("probe.maxParallelism", 4));
    return new LayeredMap(KEY.fields().length, VALUE.fields().length, 0, KeyOrder.of(hasher::hash, hasher::keyGroup),
        ENGINE, e -> { });
  }

  /** What a write answers, by its code (StateMap.ABSENT, HELD, CHANGED). */
  static final String[] STATUS = {"ABSENT", "HELD", "CHANGED", "UNCHANGED"};
  static final MemoryBudget BUDGET = new MemoryBudget(Long.getLong("probe.budget", 1L << 30));
  static final Engine ENGINE = new Engine(BUDGET);

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, false, "UTF-8");
    StateMap map = null;
    List<UnsafeRow> held = new ArrayList<>();
    List<String> heldText = new ArrayList<>();
    String line;
    while ((line = in.readLine()) != null) {
      String[] a = line.split(" ");
      switch (a[0]) {
        case "reset":
          if (map != null) {
            map.close();
          }
          map = newMap();
          held.clear();
          heldText.clear();
          out.println("OK " + a[1]);
          break;
        case "put":
          out.println(STATUS[map.put(key(a[1]), value(a[2]))]);
          break;
        case "get": {
          UnsafeRow v = map.get(key(a[1]));
          if (v != null) {
            held.add(v);
            heldText.add(show(v));
          }
          out.println(showOrNull(v));
          break;
        }
        case "remove":
          out.println(STATUS[map.remove(key(a[1]))]);
          break;
        case "spill":
          ((LayeredMap) map).spill();
          out.println("OK " + map.size());
          break;
        case "batch":
          map.endBatch();
          out.println("OK");
          break;
        case "runs":
          out.println(((LayeredMap) map).runCount());
          break;
        case "settle": {   // waits for background merges; answers the runs and the stats
          boolean settled = ((LayeredMap) map).awaitMerges(60_000);
          LocalStats s = map.stats();
          out.println((settled ? "OK " : "TIMEOUT ") + s.runs() + " " + s.spills() + " " + s.merges() + " "
              + s.diskRows() + " " + map.size());
          break;
        }
        case "fill": {
          // fill N SIZE: puts N new keys with SIZE-byte values; answers the most heap the in-heap layer
          // held after any put, and the spills
          int n = Integer.parseInt(a[1]);
          String v = hex(new byte[Integer.parseInt(a[2])]);
          long most = 0;
          for (int j = 0; j < n; j++) {
            map.put(key(hex(("fill-" + j).getBytes(StandardCharsets.UTF_8))), value(v));
            most = Math.max(most, ((LayeredMap) map).overlayBytesNow());
          }
          out.println(most + " " + ((LayeredMap) map).spills() + " " + map.size());
          break;
        }
        case "spills":
          out.println(((LayeredMap) map).spills());
          break;
        case "size":
          out.println(map.size());
          break;
        case "iter": {
          Iterator<UnsafeRowPair> it = map.iterator();
          int i = 1;
          while (it.hasNext()) {
            UnsafeRowPair p = it.next();
            String k = show(p.key());
            out.println("V " + k + " " + showOrNull(p.value()));
            String act = i < a.length ? a[i] : ".";
            i++;
            if (act.equals("r")) {
              map.remove(p.key());
            } else if (act.startsWith("u:")) {
              map.put(p.key(), value(act.substring(2)));   // a key pointing into the arena
            } else if (act.startsWith("d:")) {
              map.remove(key(act.substring(2)));
            } else if (act.startsWith("p:")) {
              String[] kv = act.split(":");
              map.put(key(kv[1]), value(kv[2]));
            }
          }
          out.println("END");
          break;
        }
        case "held": {
          String bad = null;
          for (int j = 0; j < held.size() && bad == null; j++) {
            if (!show(held.get(j)).equals(heldText.get(j))) {
              bad = heldText.get(j) + " became " + show(held.get(j));
            }
          }
          out.println(bad == null ? "OK" : "BAD " + bad);
          break;
        }
        case "race":
          out.println(race(Integer.parseInt(a[1]), Integer.parseInt(a[2])));
          break;
        default:
          out.println("ERROR unknown command " + a[0]);
      }
      out.flush();
    }
  }

  /**
   * A write store's thread changing the map while read stores of other tasks read it: one writer puts
   * (values "key#counter", growing and compacting the arena) and removes, except {@link #PINNED} keys it
   * only updates; two readers get (a pinned key must always be found) and iterate.
   * Every row a reader sees must be whole and belong to its key, rows it keeps must never change, and
   * at the end the map must hold exactly what the writer's own model says.
   */
  static final int PINNED = 100;

  static String race(int keys, int ops) throws Exception {
    StateMap map = newMap();
    java.util.Map<String, String> model = new java.util.HashMap<>();
    java.util.concurrent.atomic.AtomicReference<String> bad = new java.util.concurrent.atomic.AtomicReference<>();
    java.util.concurrent.atomic.AtomicBoolean done = new java.util.concurrent.atomic.AtomicBoolean();
    java.util.concurrent.atomic.AtomicLong reads = new java.util.concurrent.atomic.AtomicLong();
    for (int j = 0; j < PINNED; j++) {   // keys that are updated but never removed: a get must find them
      String k = hex(("p" + j).getBytes(StandardCharsets.UTF_8));
      String v = hex(("p" + j + "#start").getBytes(StandardCharsets.UTF_8));
      map.put(key(k), value(v));
      model.put(k, v);
    }
    Thread writer = new Thread(() -> {
      java.util.Random rnd = new java.util.Random(7);
      for (int i = 0; i < ops && bad.get() == null; i++) {
        boolean pinned = rnd.nextInt(4) == 0;
        String text = pinned ? "p" + rnd.nextInt(PINNED) : "k" + rnd.nextInt(keys);
        String k = hex(text.getBytes(StandardCharsets.UTF_8));
        if (!pinned && rnd.nextInt(4) == 0) {
          map.remove(key(k));
          model.remove(k);
        } else {
          String v = hex((text + "#" + i + "x".repeat(rnd.nextInt(40))).getBytes(StandardCharsets.UTF_8));
          map.put(key(k), value(v));
          model.put(k, v);
        }
      }
      done.set(true);
    });
    Runnable reader = () -> {
      java.util.Random rnd = new java.util.Random(Thread.currentThread().getId());
      List<UnsafeRow> kept = new ArrayList<>();
      List<String> keptText = new ArrayList<>();
      try {
        while (!done.get() && bad.get() == null) {
          if (rnd.nextInt(50) == 0) {
            Iterator<UnsafeRowPair> it = map.iterator();
            while (it.hasNext()) {
              UnsafeRowPair p = it.next();
              check(show(p.key()), p.value(), bad);
              reads.incrementAndGet();
            }
          } else {
            boolean pinned = rnd.nextBoolean();
            String k = hex(((pinned ? "p" : "k") + rnd.nextInt(pinned ? PINNED : keys)).getBytes(StandardCharsets.UTF_8));
            UnsafeRow v = map.get(key(k));
            if (v == null && pinned) {
              bad.compareAndSet(null, "a key never removed was not found: " + k);
            } else if (v != null) {
              check(k, v, bad);
              if (kept.size() < 10000) {
                kept.add(v);
                keptText.add(show(v));
              }
            }
            reads.incrementAndGet();
          }
        }
        for (int j = 0; j < kept.size(); j++) {
          if (!show(kept.get(j)).equals(keptText.get(j))) {
            bad.compareAndSet(null, "a kept row changed: " + keptText.get(j) + " became " + show(kept.get(j)));
          }
        }
      } catch (RuntimeException e) {
        bad.compareAndSet(null, e.toString());
      }
    };
    Thread r1 = new Thread(reader);
    Thread r2 = new Thread(reader);
    r1.start();
    r2.start();
    writer.start();
    writer.join();
    r1.join();
    r2.join();
    if (bad.get() != null) {
      return "BAD " + bad.get();
    }
    java.util.Map<String, String> seen = new java.util.HashMap<>();
    Iterator<UnsafeRowPair> it = map.iterator();
    while (it.hasNext()) {
      UnsafeRowPair p = it.next();
      if (seen.put(show(p.key()), showOrNull(p.value())) != null) {
        return "BAD key visited twice: " + show(p.key());
      }
    }
    if (!seen.equals(model) || map.size() != model.size()) {
      return "BAD the map differs from the writer's model: " + seen.size() + " vs " + model.size() + " keys";
    }
    return "OK " + reads.get();
  }

  /** A value must be whole (its length field matches) and written for this key. */
  static void check(String key, UnsafeRow value, java.util.concurrent.atomic.AtomicReference<String> bad) {
    String v = showOrNull(value);
    if (v.equals("CORRUPT") || !v.startsWith(key + hex("#".getBytes(StandardCharsets.UTF_8)))) {
      bad.compareAndSet(null, "key " + key + " read " + v);
    }
  }
}
