package io.sparkstate.shim.codec;

import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.types.StructType;

import io.sparkstate.shim.schema.SchemaCache;

/**
 * Spark's generated row projections of a schema, lent out and given back. Making one costs milliseconds
 * even when the code generator has the class cached (it generates the source to look it up): more than a
 * whole restore's changes take to decode when few keys changed, so a load borrows one instead. A
 * projection is not thread-safe; one lent out is used by its borrower alone until given back.
 */
final class Projections {
  /** Idle projections kept per schema: about as many as loads run at once on an executor. */
  static final int KEPT = 8;
  /**
   * A projection's buffer grows to its largest row and never shrinks: one that made a larger row is not
   * kept, so an idle one holds at most this much outside the memory budget.
   */
  static final int KEPT_ROW_BYTES = 1 << 20;

  private static final SchemaCache<StructType, Idle> IDLE = new SchemaCache<>();

  private Projections() {
  }

  /** A projection of {@code schema}'s rows to UnsafeRows: an idle one, or a new one. */
  static UnsafeProjection borrow(StructType schema) {
    Idle idle = IDLE.get(schema);
    UnsafeProjection p = idle == null ? null : idle.poll();
    return p != null ? p : UnsafeProjection.create(schema);
  }

  /**
   * Makes an idle projection of each schema that has none. A provider's init calls it: there a cold JVM's
   * code generation (tens of milliseconds) overlaps the worker's start, where the first load would wait for it.
   */
  static void prepare(StructType... schemas) {
    for (StructType schema : schemas) {
      Idle idle = IDLE.get(schema);
      if (idle == null || idle.size.get() == 0) {
        giveBack(schema, UnsafeProjection.create(schema), 0);
      }
    }
  }

  /**
   * Gives back what {@link #borrow} lent, whose largest row had {@code largestRow} bytes; its last row must no
   * longer be read.
   */
  static void giveBack(StructType schema, UnsafeProjection projection, int largestRow) {
    if (largestRow <= KEPT_ROW_BYTES) {
      IDLE.computeIfAbsent(schema, s -> new Idle()).offer(projection);
    }
  }

  private static final class Idle {
    final ConcurrentLinkedQueue<UnsafeProjection> queue = new ConcurrentLinkedQueue<>();
    final AtomicInteger size = new AtomicInteger();

    UnsafeProjection poll() {
      UnsafeProjection p = queue.poll();
      if (p != null) {
        size.decrementAndGet();
      }
      return p;
    }

    void offer(UnsafeProjection p) {
      if (size.incrementAndGet() <= KEPT) {
        queue.offer(p);
      } else {
        size.decrementAndGet();
      }
    }
  }
}
