package io.sparkstate.shim.engine;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * Several runs walked as one, in sort order: for each key, the record of the newest run that holds it
 * (a value, or a tombstone: the key is deleted). Runs are given newest first. Scans and merges read
 * through it; it reads blocks in file order and does not fill the block cache. Not thread-safe.
 */
final class MergedCursor {
  private final RowImage.Cursor[] cursors;
  private final boolean[] more;
  /** Records of one sort key not handed out yet (several keys share a sort key only on a hash collision). */
  private final List<Object[]> pending = new ArrayList<>();
  private int keyGroup;
  private int hash;
  private UnsafeRow key;
  private UnsafeRow value;

  MergedCursor(List<Run> runs) {
    cursors = new RowImage.Cursor[runs.size()];
    more = new boolean[runs.size()];
    for (int i = 0; i < cursors.length; i++) {
      cursors[i] = runs.get(i).image.cursor();
      more[i] = cursors[i].next();
    }
  }

  /** Moves to the next key; false when there is none. */
  boolean next() {
    if (!pending.isEmpty()) {
      take(pending.remove(0));
      return true;
    }
    long s = Long.MAX_VALUE;
    int first = -1;
    for (int i = 0; i < cursors.length; i++) {
      if (more[i] && cursors[i].sortKey() < s) {
        s = cursors[i].sortKey();
        first = i;
      }
    }
    if (first < 0) {
      return false;
    }
    boolean alone = true;
    for (int i = first + 1; i < cursors.length && alone; i++) {
      alone = !more[i] || cursors[i].sortKey() != s;
    }
    RowImage.Cursor c = cursors[first];
    if (alone) {
      keyGroup = c.keyGroup();
      hash = c.hash();
      key = c.key();
      value = c.value();
      more[first] = c.next();
      if (!more[first] || c.sortKey() != s) {
        return true;
      }
      pending.add(new Object[] {keyGroup, hash, key, value});   // the same run holds more of this sort key
      gather(s, first);
      take(pending.remove(0));
      return true;
    }
    gather(s, first);
    take(pending.remove(0));
    return true;
  }

  /** Collects the records of sort key {@code s} from run {@code from} on, newest run first, a key once. */
  private void gather(long s, int from) {
    for (int i = from; i < cursors.length; i++) {
      RowImage.Cursor c = cursors[i];
      while (more[i] && c.sortKey() == s) {
        UnsafeRow k = c.key();
        boolean seen = false;
        for (Object[] p : pending) {
          seen |= p[2].equals(k);
        }
        if (!seen) {
          pending.add(new Object[] {c.keyGroup(), c.hash(), k, c.value()});
        }
        more[i] = c.next();
      }
    }
  }

  private void take(Object[] record) {
    keyGroup = (Integer) record[0];
    hash = (Integer) record[1];
    key = (UnsafeRow) record[2];
    value = (UnsafeRow) record[3];
  }

  int keyGroup() {
    return keyGroup;
  }

  int hash() {
    return hash;
  }

  UnsafeRow key() {
    return key;
  }

  /** The key's value, or null: the newest run that holds it holds a tombstone. */
  UnsafeRow value() {
    return value;
  }
}
