package io.sparkstate.shim.engine;

/**
 * A row image's Bloom filter over its records' hashes (docs/row-image.md, "Format version 2: the key
 * filter"): a lookup of a key the file does not hold reads no block in about 99% of cases. The bits come
 * from Spark's 32-bit hash of the key alone, so every layer and both languages agree on them, and a
 * prefix scan (whose hash is the prefix's) can ask too. Immutable once built; thread-safe to read.
 */
final class KeyFilter {
  /** Bits per key the writers size a filter for, and hashes per key: about 0.8% false positives. */
  static final int BITS_PER_KEY = 10;
  static final int HASHES = 7;
  static final int HEADER_BYTES = 16;

  private final long[] words;
  private final long bits;
  private final int hashes;

  KeyFilter(long[] words, int hashes) {
    if (words.length == 0 || hashes < 1 || hashes > 30) {
      throw new IllegalArgumentException("spark_state: a key filter of " + words.length + " words and " + hashes
          + " hashes");
    }
    this.words = words;
    this.bits = 64L * words.length;
    this.hashes = hashes;
  }

  /** An empty filter sized for {@code records} keys. */
  static KeyFilter forRecords(long records) {
    long w = Math.max(1, (BITS_PER_KEY * Math.max(records, 0) + 63) / 64);
    if (w > Integer.MAX_VALUE - 16) {
      throw new IllegalArgumentException("spark_state: a key filter for " + records + " records");
    }
    return new KeyFilter(new long[(int) w], HASHES);
  }

  /** Notes a record's hash. Not thread-safe (a writer fills its own filter). */
  void add(int hash) {
    long z = mix(hash);
    long a = z & 0xFFFFFFFFL;
    long b = (z >>> 32) | 1;
    for (int i = 0; i < hashes; i++) {
      long bit = (((a + i * b) & 0xFFFFFFFFL) * bits) >>> 32;
      words[(int) (bit >>> 6)] |= 1L << bit;
    }
  }

  /** False only if no record of this hash was added. */
  boolean mightContain(int hash) {
    long z = mix(hash);
    long a = z & 0xFFFFFFFFL;
    long b = (z >>> 32) | 1;
    for (int i = 0; i < hashes; i++) {
      long bit = (((a + i * b) & 0xFFFFFFFFL) * bits) >>> 32;
      if ((words[(int) (bit >>> 6)] & (1L << bit)) == 0) {
        return false;
      }
    }
    return true;
  }

  /** The bit positions of a hash in a filter of {@code bits} bits and {@code hashes} probes (test vectors). */
  static long[] positions(int hash, int hashes, long bits) {
    long z = mix(hash);
    long a = z & 0xFFFFFFFFL;
    long b = (z >>> 32) | 1;
    long[] out = new long[hashes];
    for (int i = 0; i < hashes; i++) {
      out[i] = (((a + i * b) & 0xFFFFFFFFL) * bits) >>> 32;
    }
    return out;
  }

  /** SplitMix64's finalizer of the hash as an unsigned 32-bit number. */
  static long mix(int hash) {
    long z = (hash & 0xFFFFFFFFL) + 0x9E3779B97F4A7C15L;
    z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
    z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
    return z ^ (z >>> 31);
  }

  long[] words() {
    return words;
  }

  int hashes() {
    return hashes;
  }

  /** Heap the filter takes. */
  long bytes() {
    return 16L + 8L * words.length;
  }
}
