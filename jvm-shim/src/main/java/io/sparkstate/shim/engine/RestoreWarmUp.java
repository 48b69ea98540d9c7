package io.sparkstate.shim.engine;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.SequenceInputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.UUID;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * One restore over a remote row image, run by the executor plugin when the executor starts: a few thousand rows
 * of an image it writes itself and "fetches" from memory, opened through the executor's {@link ImageCache} and
 * {@link BlockCache}, its changes deferred ({@link DeferredRestore}), looked up and scanned. A JVM that has never run that path loads and interprets
 * its classes inside the first task that restores a store: about 90 ms of a cold {@code getStore} and first
 * {@code get} (benchmarks/results/remote-restore/). Nothing of it stays: its copy is discarded, its blocks leave
 * the cache with the image, its file is deleted.
 */
final class RestoreWarmUp {
  static final int ROWS = 2_000;
  private static final StructType KEY = new StructType().add("k", DataTypes.LongType, false);
  /** Key i sorts as (key group 0, hash i): the image needs no hasher, and lookups find what was written. */
  private static final KeyOrder ORDER = KeyOrder.of(k -> (int) k.getLong(0), hash -> 0);

  private RestoreWarmUp() {
  }

  /** Runs the restore in {@code engine}; answers the sum of the values it read (so none of it is dead code). */
  static long run(Engine engine) throws IOException {
    byte[] bytes = image();
    RangeReader reader = (from, to, body) -> {   // every range in one stream, one after the other, as the worker's
      List<InputStream> ranges = new ArrayList<>();
      for (int i = 0; i < from.length; i++) {
        ranges.add(new ByteArrayInputStream(bytes, (int) from[i], (int) (to[i] - from[i])));
      }
      body.read(new SequenceInputStream(Collections.enumeration(ranges)));
    };
    RemoteImage remote = new RemoteImage("spark_state warm-up " + UUID.randomUUID(), "", bytes.length, new long[0],
        new long[0], new byte[0][], reader, false);
    StoreSpec spec = new StoreSpec(KEY, 1, 0, ORDER, damage -> { });
    try {
      Restore restore = engine.restore(spec, remote, ROWS, 1);
      if (restore == null) {
        throw new IOException("the warm-up's row image did not open");
      }
      // its changes deferred, as a load from object storage has them: the first get looks up on another thread
      StateMap map = new DeferredRestore(restore, ROWS, r -> r.change(row(3), row(-3)));
      long sum = 0;
      try {
        for (int i = 0; i < ROWS; i += 37) {
          UnsafeRow v = map.get(row(i));
          sum += v == null ? 0 : v.getLong(0);
        }
        Iterator<UnsafeRowPair> all = map.iterator();
        while (all.hasNext()) {
          sum += all.next().value().getLong(0);
        }
      } finally {
        map.close();
      }
      return sum;
    } finally {
      engine.images().discard(remote.key());
    }
  }

  /** A row image of keys 0..ROWS-1, each its own value, as the JVM writes its spill runs (with a key filter). */
  private static byte[] image() throws IOException {
    Path file = LocalDirectory.newSpillFile();
    try {
      try (RowImageWriter w = new RowImageWriter(file, RowImageWriter.DEFAULT_BLOCK_BYTES, true, ROWS)) {
        for (int i = 0; i < ROWS; i++) {
          UnsafeRow row = row(i);
          w.add(0, i, row, row);
        }
        w.finish();
      }
      return Files.readAllBytes(file);
    } finally {
      Files.deleteIfExists(file);
    }
  }

  private static UnsafeRow row(long n) {
    UnsafeRowWriter w = new UnsafeRowWriter(1, 0);
    w.reset();
    w.zeroOutNullBytes();
    w.write(0, n);
    return w.getRow();
  }
}
