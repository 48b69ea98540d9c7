package io.sparkstate.shim;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.function.LongFunction;

import io.sparkstate.shim.codec.ArrowCodec;
import io.sparkstate.shim.engine.StateMap;
import io.sparkstate.shim.worker.StoreClient;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.RecordType$;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.NextIterator;
import scala.Enumeration;
import scala.Tuple4;

/**
 * A store's history for Spark's {@code SupportsFineGrainedReplay} (the {@code statestore} reader's
 * {@code readChangeFeed} and {@code snapshotStartBatchId} options): the changes each version's commit
 * recorded, and a version's state replayed from an earlier one, both read by the worker from the
 * chain (spark_state/chain/history.py; ops {@code changes} and {@code replay}). A range that is no
 * longer recorded fails with the worker's message naming the batches, before the feed's first row.
 */
final class ChangeFeed {
  private final StoreClient client;
  private final StructType keySchema;
  private final StructType valueSchema;
  private final LongFunction<StateMap> newMap;

  /** {@code newMap}: the provider's row store for about that many rows (a replayed version's rows). */
  ChangeFeed(StoreClient client, StructType keySchema, StructType valueSchema, LongFunction<StateMap> newMap) {
    this.client = client;
    this.keySchema = keySchema;
    this.valueSchema = valueSchema;
    this.newMap = newMap;
  }

  /**
   * Spark's change feed of versions {@code startVersion..endVersion}: (PUT_RECORD or DELETE_RECORD, key,
   * value or null, batch id = version - 1), one version's changes in memory at a time. Each key a
   * batch wrote appears once, with its last write.
   */
  NextIterator<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> changes(long startVersion, long endVersion) {
    return new Feed(startVersion, endVersion);
  }

  /** The state at {@code endVersion}, rebuilt from {@code snapshotVersion} and the changes recorded after it. */
  StateVersion replay(long snapshotVersion, long endVersion) {
    return client.replay(snapshotVersion, endVersion, (rows, commitId, image, state) -> {
      StateMap map = newMap.apply(rows);
      boolean typed = ArrowCodec.decodeState(state, keySchema, valueSchema, map::put);
      return new StateVersion(map, endVersion, commitId, typed);
    });
  }

  private final class Feed extends NextIterator<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> {
    private final long start;
    private final long end;
    private long next;
    private Iterator<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> current = Collections.emptyIterator();

    Feed(long start, long end) {
      this.start = start;
      this.end = end;
      this.next = start;
    }

    @Override
    public Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object> getNext() {
      while (!current.hasNext()) {
        if (next > end) {
          finished_$eq(true);
          return null;
        }
        // The first request has the worker check the whole range: no rows of a history it cannot finish.
        current = fetch(next, next == start ? end : -1).iterator();
        next++;
      }
      return current.next();
    }

    @Override
    public void close() {
      current = Collections.emptyIterator();
    }
  }

  private List<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> fetch(long version, long through) {
    Long batch = version - 1;
    Enumeration.Value put = RecordType$.MODULE$.PUT_RECORD();
    Enumeration.Value delete = RecordType$.MODULE$.DELETE_RECORD();
    return client.changes(version, through, (rows, commitId, image, in) -> {
      List<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>> out = new ArrayList<>((int) Math.min(rows, 1 << 16));
      ArrowCodec.decodeState(in, keySchema, valueSchema, (k, v) -> out.add(v == null
          ? new Tuple4<>(delete, k.copy(), null, batch)
          : new Tuple4<>(put, k.copy(), v.copy(), batch)), true);
      return out;
    });
  }
}
