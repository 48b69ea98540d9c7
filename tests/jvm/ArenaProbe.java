package io.sparkstate.shim;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;

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
 * </pre>
 */
public class ArenaProbe {
  static final StructType KEY = new StructType().add("k", DataTypes.StringType, false);
  static final StructType VALUE = new StructType().add("v", DataTypes.StringType, false).add("n", DataTypes.LongType, false);
  static final UnsafeProjection KEYS = UnsafeProjection.create(KEY);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);

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
    return KEYS.apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(unhex(h))})).copy();
  }

  static UnsafeRow value(String h) {
    byte[] b = unhex(h);
    return VALUES.apply(new GenericInternalRow(new Object[] {UTF8String.fromBytes(b), (long) b.length})).copy();
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
          map = new StateMap(0, null, 0, KEY.fields().length, VALUE.fields().length);
          held.clear();
          heldText.clear();
          out.println("OK " + a[1]);
          break;
        case "put":
          out.println(showOrNull(map.put(key(a[1]), value(a[2]))));
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
          out.println(showOrNull(map.remove(key(a[1]))));
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
        default:
          out.println("ERROR unknown command " + a[0]);
      }
      out.flush();
    }
  }
}
