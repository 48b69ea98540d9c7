package io.sparkstate.shim.engine;

import io.sparkstate.shim.codec.KeyHasher;
import io.sparkstate.shim.memory.MemoryBudget;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Random;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Drives a prefix-scan store (a {@link LayeredMap} with a {@link PrefixIndex}, as session windows use: keys of
 * two columns, the first the prefix, hashed by the prefix alone) from stdin for tests/jvm/test_prefix_scan.py,
 * one command a line; a key is "P S" (P the prefix's bytes in hex, "-" empty; S an int), values hex:
 * <pre>
 *   reset N               → OK N     (a new, empty store)
 *   put P S V             → ABSENT, HELD, CHANGED or UNCHANGED (held or not: settled when the size is asked)
 *   get P S               → value or NULL (the row is kept: see "held")
 *   remove P S            → ABSENT, HELD or CHANGED
 *   scan P A1 A2 ...      → "V P S V" per row of prefix P, then END; after the i-th row, action Ai runs:
 *                           "." nothing, "r" remove that key, "u:V" put that key with V, "d:S" remove (P, S),
 *                           "p:S:V" put (P, S) with V, "D:Q:S" remove (Q, S), "P:Q:S:V" put (Q, S) with V
 *   iter                  → "V P S V" per row of the store, then END
 *   spill                 → OK size   (the heap rows become runs now)
 *   batch                 → OK        (the batch ends)
 *   restore SEED KNOWN    → OK size   (the store restored lazily over a row image of its rows, see {@link #restore})
 *   settle                → OK|TIMEOUT runs spills merges diskRows size (after waiting for background merges)
 *   size                  → n
 *   held                  → OK, or BAD and the first row handed out whose bytes changed since
 * </pre>
 */
public class PrefixProbe {
  static final StructType KEY = new StructType().add("p", DataTypes.StringType, false).add("s", DataTypes.IntegerType, false);
  static final StructType PREFIX = new StructType().add("p", DataTypes.StringType, false);
  static final StructType VALUE = new StructType().add("v", DataTypes.StringType, false).add("n", DataTypes.LongType, false);
  static final UnsafeProjection KEYS = UnsafeProjection.create(KEY);
  static final UnsafeProjection PREFIXES = UnsafeProjection.create(PREFIX);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);
  static final String[] STATUS = {"ABSENT", "HELD", "CHANGED", "UNCHANGED"};

  static final MemoryBudget BUDGET = new MemoryBudget(Long.getLong("probe.budget", 1L << 30));
  static final Engine ENGINE = new Engine(BUDGET);
  static final KeyHasher HASHER = new KeyHasher(KEY, KeyHasher.hashFieldCount(KEY, 1, "default"),
      Integer.getInteger("probe.maxParallelism", 4));
  static final StoreSpec SPEC = new StoreSpec(KEY, VALUE.fields().length, 1, KeyOrder.of(HASHER::hash, HASHER::keyGroup),
      e -> { });

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

  static UnsafeRow key(String p, String s) {
    return KEYS.apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(unhex(p)), Integer.parseInt(s)})).copy();
  }

  static UnsafeRow prefix(String p) {
    return PREFIXES.apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(unhex(p))})).copy();
  }

  static UnsafeRow value(String h) {
    byte[] b = unhex(h);
    return VALUES.apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(b), (long) b.length})).copy();
  }

  static String showKey(UnsafeRow key) {
    return hex(key.getUTF8String(0).getBytes()) + " " + key.getInt(1);
  }

  static String showValue(UnsafeRow value) {
    if (value == null) {
      return "NULL";
    }
    if (value.getLong(1) != value.getUTF8String(0).numBytes()) {
      return "CORRUPT";
    }
    return hex(value.getUTF8String(0).getBytes());
  }

  static StateMap map;
  static final List<UnsafeRow> HELD = new ArrayList<>();
  static final List<String> HELD_TEXT = new ArrayList<>();

  static void hold(UnsafeRow v) {
    HELD.add(v);
    HELD_TEXT.add(showValue(v));
  }

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, false, "UTF-8");
    String line;
    while ((line = in.readLine()) != null) {
      String[] a = line.split(" ");
      switch (a[0]) {
        case "reset":
          if (map != null) {
            map.close();
          }
          map = ENGINE.newStore(SPEC, 0);
          HELD.clear();
          HELD_TEXT.clear();
          out.println("OK " + a[1]);
          break;
        case "put":
          out.println(STATUS[map.put(key(a[1], a[2]), value(a[3]))]);
          break;
        case "get": {
          UnsafeRow v = map.get(key(a[1], a[2]));
          if (v != null) {
            hold(v);
          }
          out.println(showValue(v));
          break;
        }
        case "remove":
          out.println(STATUS[map.remove(key(a[1], a[2]))]);
          break;
        case "scan": {
          Iterator<UnsafeRowPair> it = map.prefixScan(prefix(a[1]));
          int i = 2;
          while (it.hasNext()) {
            UnsafeRowPair p = it.next();
            hold(p.value());
            out.println("V " + showKey(p.key()) + " " + showValue(p.value()));
            String act = i < a.length ? a[i] : ".";
            i++;
            String[] t = act.split(":");
            switch (t[0]) {
              case "r":
                map.remove(p.key());
                break;
              case "u":
                map.put(p.key(), value(t[1]));   // a key pointing into the heap or a block
                break;
              case "d":
                map.remove(key(a[1], t[1]));
                break;
              case "p":
                map.put(key(a[1], t[1]), value(t[2]));
                break;
              case "D":
                map.remove(key(t[1], t[2]));
                break;
              case "P":
                map.put(key(t[1], t[2]), value(t[3]));
                break;
              default:
                break;
            }
          }
          out.println("END");
          break;
        }
        case "iter": {
          Iterator<UnsafeRowPair> it = map.iterator();
          while (it.hasNext()) {
            UnsafeRowPair p = it.next();
            out.println("V " + showKey(p.key()) + " " + showValue(p.value()));
          }
          out.println("END");
          break;
        }
        case "spill":
          ((LayeredMap) map).spill();
          out.println("OK " + map.size());
          break;
        case "batch":
          map.endBatch();
          out.println("OK");
          break;
        case "restore":
          map = restore(map, Long.parseLong(a[1]), a[2].equals("1"));
          out.println("OK " + map.size());
          break;
        case "settle": {
          boolean settled = ((LayeredMap) map).awaitMerges(60_000);
          LocalStats s = map.stats();
          out.println((settled ? "OK " : "TIMEOUT ") + s.runs() + " " + s.spills() + " " + s.merges() + " "
              + s.diskRows() + " " + map.size());
          break;
        }
        case "size":
          out.println(map.size());
          break;
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
        default:
          out.println("ERROR unknown command " + a[0]);
      }
      out.flush();
    }
  }

  /**
   * What a provider's lazy load does: the store is restored over a row image of "the checkpoint's snapshot"
   * and the changes after it are applied blind ({@link Restore#change}). The snapshot is made from the
   * store's rows so that snapshot + changes = those rows: of each row, the image holds it (3 in 5), an older
   * value the changes replace (1 in 5), or nothing and the changes add it (1 in 5); the image also holds a
   * few rows of the same prefixes the changes delete, and the changes add and delete a key the image never
   * had. {@code known}: the load reply tells the key count (else the store counts by a walk). The old
   * store is closed; the new one begins a batch.
   */
  static StateMap restore(StateMap old, long seed, boolean known) throws IOException {
    Random rnd = new Random(seed);
    List<UnsafeRow[]> rows = new ArrayList<>();
    Iterator<UnsafeRowPair> it = old.iterator();
    while (it.hasNext()) {
      UnsafeRowPair p = it.next();
      rows.add(new UnsafeRow[] {p.key().copy(), p.value().copy()});
    }
    List<UnsafeRow[]> image = new ArrayList<>();
    List<UnsafeRow[]> changes = new ArrayList<>();
    for (UnsafeRow[] r : rows) {
      int c = rnd.nextInt(5);
      if (c < 3) {
        image.add(r);
      } else if (c == 3) {
        image.add(new UnsafeRow[] {r[0], value(hex(("stale-" + rnd.nextInt(1000)).getBytes(StandardCharsets.UTF_8)))});
        changes.add(r);
      } else {
        changes.add(r);
      }
    }
    for (int i = 0, n = rows.isEmpty() ? 1 : rnd.nextInt(4); i < n; i++) {
      String p = rows.isEmpty() ? "-" : hex(rows.get(rnd.nextInt(rows.size()))[0].getUTF8String(0).getBytes());
      UnsafeRow gone = key(p, Integer.toString(-1 - i));
      image.add(new UnsafeRow[] {gone, value(hex(("gone-" + i).getBytes(StandardCharsets.UTF_8)))});
      changes.add(new UnsafeRow[] {gone, null});
    }
    Collections.shuffle(changes, rnd);
    UnsafeRow passing = key("7a7a", "-100");   // added and deleted again after the snapshot
    changes.add(new UnsafeRow[] {passing, value("00")});
    changes.add(new UnsafeRow[] {passing, null});

    Path file = Files.createTempFile(Paths.get(System.getProperty("java.io.tmpdir")), "snapshot-", ".img");
    int n = image.size();
    int[] groups = new int[n];
    int[] hashes = new int[n];
    UnsafeRow[] keys = new UnsafeRow[n];
    UnsafeRow[] values = new UnsafeRow[n];
    for (int i = 0; i < n; i++) {
      keys[i] = image.get(i)[0];
      values[i] = image.get(i)[1];
      hashes[i] = SPEC.order().hash(keys[i]);
      groups[i] = SPEC.order().keyGroup(hashes[i]);
    }
    try (RowImageWriter w = new RowImageWriter(file, 200, true, n)) {   // small blocks: a prefix spans several
      w.addUnsorted(n, groups, hashes, keys, values);
      w.finish();
    }
    old.close();
    Restore restore = ENGINE.restore(SPEC, file, n, true, changes.size());
    if (restore == null) {
      throw new IllegalStateException("the snapshot's image was refused");
    }
    for (UnsafeRow[] c : changes) {
      restore.change(c[0], c[1]);
    }
    StateMap restored = restore.finish(known ? rows.size() : -1);
    restored.endBatch();
    return restored;
  }
}
