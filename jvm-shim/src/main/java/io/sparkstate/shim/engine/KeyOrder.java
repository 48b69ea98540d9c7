package io.sparkstate.shim.engine;

import java.util.function.IntUnaryOperator;
import java.util.function.ToIntFunction;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * How a store's keys are ordered on local disk: by key group, then by Spark's hash of the key's hash
 * columns (docs/row-image.md). The provider's {@code KeyHasher} computes both; the engine only asks.
 */
public interface KeyOrder {
  /** Spark's Murmur3 hash of the key's hash columns (for a prefix-scan store: of the prefix). */
  int hash(UnsafeRow key);

  /** The key group of a hash: {@code pmod(hash, maxParallelism)}. */
  int keyGroup(int hash);

  /** The order these two functions define (e.g. {@code KeyOrder.of(hasher::hash, hasher::keyGroup)}). */
  static KeyOrder of(ToIntFunction<UnsafeRow> hash, IntUnaryOperator keyGroup) {
    return new KeyOrder() {
      @Override
      public int hash(UnsafeRow key) {
        return hash.applyAsInt(key);
      }

      @Override
      public int keyGroup(int h) {
        return keyGroup.applyAsInt(h);
      }
    };
  }
}
