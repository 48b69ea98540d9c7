package io.sparkstate.shim.codec;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.Murmur3Hash;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.jdk.javaapi.CollectionConverters;

/**
 * KeyHasher shared by stores and used by many threads at once: every thread's hashes of a key (long, string)
 * hashed by both columns, and by the first alone (a prefix), equal Spark's own interpreted Murmur3Hash (seed 42,
 * what HashPartitioning computes); KeyHasher.of shares one hasher per hashed types (and nullability) and key-group
 * count. Prints
 * OK or FAILED with the first difference.
 */
public class HasherProbe {
  static final int ROWS = 20_000;
  static final int THREADS = 4;

  public static void main(String[] args) throws Exception {
    StructType key = new StructType().add("id", DataTypes.LongType).add("name", DataTypes.StringType);
    StructType renamed = new StructType().add("user", DataTypes.LongType).add("page", DataTypes.StringType);
    StructType notNull = new StructType().add("id", DataTypes.LongType, false).add("name", DataTypes.StringType, false);
    UnsafeProjection toUnsafe = UnsafeProjection.create(key);
    List<UnsafeRow> rows = new ArrayList<>();
    for (int i = 0; i < ROWS; i++) {
      Object name = i % 7 == 0 ? null : UTF8String.fromString("n" + (i * 31 % 1000));
      rows.add(toUnsafe.apply(new GenericInternalRow(new Object[] {(long) i * 2654435761L, name})).copy());
    }
    String failed = null;
    if (KeyHasher.of(key, 2, 128) != KeyHasher.of(renamed, 2, 128)) {
      failed = "two key schemas of the same types got two hashers";
    } else if (KeyHasher.of(key, 2, 128) == KeyHasher.of(key, 2, 64) || KeyHasher.of(key, 2, 128) == KeyHasher.of(key, 1, 128)
        || KeyHasher.of(key, 2, 128) == KeyHasher.of(notNull, 2, 128)) {
      failed = "hashers of other key-group counts, hashed columns or nullability are shared";
    }
    for (int fields = 1; fields <= 2 && failed == null; fields++) {
      List<Expression> refs = new ArrayList<>();
      for (int i = 0; i < fields; i++) {
        refs.add(new BoundReference(i, key.fields()[i].dataType(), true));
      }
      Murmur3Hash spark = new Murmur3Hash(CollectionConverters.asScala(refs).toList(), KeyHasher.SEED);
      int[] expected = new int[ROWS];
      for (int i = 0; i < ROWS; i++) {
        expected[i] = (Integer) spark.eval(rows.get(i));
      }
      KeyHasher shared = KeyHasher.of(key, fields, 100);
      ExecutorService pool = Executors.newFixedThreadPool(THREADS);
      List<Future<String>> done = new ArrayList<>();
      for (int t = 0; t < THREADS; t++) {
        int offset = t * 997;
        done.add(pool.submit(() -> {
          for (int round = 0; round < 5; round++) {
            for (int j = 0; j < ROWS; j++) {
              int i = (j + offset) % ROWS;
              int h = shared.hash(rows.get(i));
              if (h != expected[i] || shared.keyGroup(h) != Math.floorMod(expected[i], 100)) {
                return "row " + i + ": " + h + ", Spark's Murmur3Hash " + expected[i];
              }
            }
          }
          return null;
        }));
      }
      for (Future<String> f : done) {
        String problem = f.get();
        if (problem != null && failed == null) {
          failed = fields + " hashed column(s), " + problem;
        }
      }
      pool.shutdown();
    }
    System.out.println(failed == null ? "OK" : "FAILED " + failed);
  }
}
