package io.sparkstate.shim.codec;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * 64-bit fingerprints of the keys a batch changed (Spark's key hash and the row's own hash), to tell
 * whether its change log may name a key twice: then the worker keeps each key's last row. A false
 * "twice" (two keys with one fingerprint) only costs the worker that pass. A primitive open-addressing
 * set: far cheaper than a map of rows.
 */
final class KeyFingerprints {
  private long[] slots;
  private int size;
  private boolean hasZero;
  private boolean repeated;

  KeyFingerprints(long expected) {
    int capacity = 16;
    while (capacity < Math.min(expected, 1L << 28) * 2) {
      capacity <<= 1;
    }
    slots = new long[capacity];
  }

  /** Notes a changed key ({@code hash}: Spark's hash of it). */
  void add(int hash, UnsafeRow key) {
    long f = ((long) hash << 32) | (key.hashCode() & 0xffffffffL);
    if (f == 0) {
      repeated |= hasZero;
      hasZero = true;
      return;
    }
    int mask = slots.length - 1;
    int i = (int) mix(f) & mask;
    while (slots[i] != 0) {
      if (slots[i] == f) {
        repeated = true;
        return;
      }
      i = (i + 1) & mask;
    }
    slots[i] = f;
    if (++size * 2 > slots.length) {
      grow();
    }
  }

  /** Whether some key (or fingerprint) was added twice. */
  boolean repeated() {
    return repeated;
  }

  private void grow() {
    long[] old = slots;
    slots = new long[old.length * 2];
    int mask = slots.length - 1;
    for (long f : old) {
      if (f != 0) {
        int i = (int) mix(f) & mask;
        while (slots[i] != 0) {
          i = (i + 1) & mask;
        }
        slots[i] = f;
      }
    }
  }

  private static long mix(long f) {
    f *= 0x9E3779B97F4A7C15L;
    return f ^ (f >>> 32);
  }
}
