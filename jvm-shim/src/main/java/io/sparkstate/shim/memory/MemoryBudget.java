package io.sparkstate.shim.memory;

import java.lang.ref.Cleaner;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The one budget of everything spark_state holds in an executor JVM, heap and native alike, as
 * RocksDB's bounded memory caps its memtables, cache and filters with one number: the option
 * {@code memoryLimit}, by default half of what Spark's memory model leaves to user code
 * ({@link #defaultLimit}), so the state never competes with Spark's own execution memory.
 *
 * <p>Every holder takes a {@link Reservation} and keeps it equal to what it holds; the budget only
 * adds them up. Who gives memory back, and how, is the holder's business: state rows spill, the
 * block cache evicts, change logs cut chunks early, filters and indexes stay pinned. A holder asks
 * {@link #overLimit} and {@link #available} to decide. One per executor JVM.
 */
public final class MemoryBudget {
  private static final Logger LOG = LoggerFactory.getLogger(MemoryBudget.class);
  /** Spark's reserved system memory ({@code UnifiedMemoryManager.RESERVED_SYSTEM_MEMORY_BYTES}). */
  static final long SPARK_RESERVED = 300L << 20;
  /** Smallest default: a budget too small to hold a block cache and one batch's buffers only thrashes. */
  static final long MIN_DEFAULT = 32L << 20;
  /** The share of Spark's user memory the default takes. */
  static final double USER_MEMORY_SHARE = 0.5;
  static final Cleaner CLEANER = Cleaner.create();

  private static final MemoryBudget EXECUTOR = new MemoryBudget(-1);

  private volatile long limit;
  private volatile boolean defaulted;
  private final AtomicLong used = new AtomicLong();
  private final Map<String, AtomicLong> byKind = new ConcurrentHashMap<>();
  private final AtomicBoolean warned = new AtomicBoolean();

  /** A budget of {@code limit} bytes (negative: the default, computed when first asked). */
  public MemoryBudget(long limit) {
    this.limit = limit;
    this.defaulted = limit < 0;
  }

  /** The executor's budget. */
  public static MemoryBudget executor() {
    return EXECUTOR;
  }

  /**
   * The default limit: half of Spark's user memory, {@code (heap - 300 MiB) * (1 - spark.memory.fraction)},
   * the part of the heap Spark's unified memory manager leaves to user data structures (145 MiB of a
   * 1 GiB heap; 1.66 GiB of 8 GiB). At least {@link #MIN_DEFAULT}.
   */
  public static long defaultLimit() {
    double fraction = 0.6;
    long reserved = SPARK_RESERVED;
    try {
      SparkEnv env = SparkEnv.get();
      if (env != null) {
        SparkConf conf = env.conf();
        fraction = conf.getDouble("spark.memory.fraction", 0.6);
        reserved = conf.getLong("spark.testing.reservedMemory", conf.contains("spark.testing") ? 0 : reserved);
      }
    } catch (RuntimeException | LinkageError e) {
      // no Spark here (a tool, a probe): Spark's defaults
    }
    long heap = Runtime.getRuntime().maxMemory();
    long usable = Math.max(0, heap - reserved);
    return Math.max(MIN_DEFAULT, (long) (usable * (1 - fraction) * USER_MEMORY_SHARE));
  }

  /** Sets the limit (bytes; null or not positive: the default). The option set of the store opened last wins. */
  public void setLimit(Long bytes) {
    if (bytes == null || bytes <= 0) {
      defaulted = true;
      limit = -1;
    } else {
      defaulted = false;
      limit = bytes;
    }
  }

  /** The limit in bytes. */
  public long limit() {
    long l = limit;
    if (l < 0) {
      synchronized (this) {
        if (limit < 0) {
          limit = defaultLimit();
          LOG.info("spark_state: memory budget {} MiB (half of Spark's user memory; option memoryLimit)",
              limit >> 20);
        }
        l = limit;
      }
    }
    return l;
  }

  /** Whether the limit is the default one. */
  public boolean isDefault() {
    return defaulted;
  }

  /** Bytes all reservations hold now. */
  public long used() {
    return used.get();
  }

  /** Bytes the holders of one kind hold now (see {@link Reservation#kind}). */
  public long used(String kind) {
    AtomicLong n = byKind.get(kind);
    return n == null ? 0 : n.get();
  }

  /** What each kind of holder holds now, by kind (metrics, logs). */
  /** A size for a log line: bytes, KiB or MiB, whichever reads best (a small budget is not "0 MiB"). */
  public static String size(long bytes) {
    if (bytes < 10L << 10) {
      return bytes + " B";
    }
    return bytes < 10L << 20 ? (bytes >> 10) + " KiB" : (bytes >> 20) + " MiB";
  }

  /** What each kind of holder holds, for a log line. */
  public String describeUse() {
    StringBuilder out = new StringBuilder("{");
    usedByKind().forEach((k, v) -> out.append(out.length() > 1 ? ", " : "").append(k).append('=').append(size(v)));
    return out.append('}').toString();
  }

  public Map<String, Long> usedByKind() {
    Map<String, Long> out = new TreeMap<>();
    byKind.forEach((k, v) -> out.put(k, v.get()));
    return out;
  }

  /** Whether the holders together hold more than the limit. */
  public boolean overLimit() {
    return used.get() > limit();
  }

  /** Bytes left under the limit (negative: over it). */
  public long available() {
    return limit() - used.get();
  }

  /**
   * A new reservation of {@code kind} (e.g. "rows", "cache", "filters"), initially of 0 bytes. With an
   * {@code owner}, the reservation is released when the owner becomes unreachable, should nobody close
   * it (a version Spark dropped without closing): the reservation must not reference the owner.
   */
  public Reservation reserve(String kind, Object owner) {
    Reservation r = new Reservation(this, kind, byKind.computeIfAbsent(kind, k -> new AtomicLong()));
    if (owner != null) {
      CLEANER.register(owner, r::close);
    }
    return r;
  }

  void add(AtomicLong kind, long delta) {
    used.addAndGet(delta);
    kind.addAndGet(delta);
  }

  /**
   * Logs once per JVM that memory nothing can give back (filters, indexes, open buffers) fills the
   * budget, naming the option to raise. Returns whether this call logged.
   */
  public boolean warnPinned(String what) {
    if (!warned.compareAndSet(false, true)) {
      return false;
    }
    LOG.warn("spark_state: {} fill the state memory budget ({} of {} in use: {}); state rows spill at "
        + "every check. Raise spark.sql.streaming.stateStore.sparkState.memoryLimit or the executor memory.",
        what, size(used()), size(limit()), describeUse());
    return true;
  }
}
