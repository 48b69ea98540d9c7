package io.sparkstate.shim;

import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import io.sparkstate.shim.engine.LocalStats;
import io.sparkstate.shim.engine.StateMap;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomSumMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomTimingMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;
import scala.jdk.javaapi.CollectionConverters;

/** The custom metrics every spark_state store reports to Spark (a batch's progress, the SQL UI). */
final class Metrics {
  static final StateStoreCustomMetric COMMIT_TIME = new StateStoreCustomTimingMetric(
      "sparkStateCommitTimeMs", "spark_state: time to ship a commit to the worker and have it made durable");
  static final StateStoreCustomMetric LOAD_TIME = new StateStoreCustomTimingMetric(
      "sparkStateLoadTimeMs", "spark_state: time to load a version from the worker");
  static final StateStoreCustomMetric BYTES_WRITTEN = new StateStoreCustomSumMetric(
      "sparkStateBytesWritten", "spark_state: bytes written to checkpoint storage by commits");
  static final StateStoreCustomMetric WORKER_RESTARTS = new StateStoreCustomSumMetric(
      "sparkStateWorkerRestarts", "spark_state: state worker restarts seen during the batch");
  static final StateStoreCustomMetric MAINTENANCE_FAILURES = new StateStoreCustomSumMetric(
      MaintenanceWarnings.METRIC, "spark_state: consecutive failed background maintenance runs of the stores");

  static final StateStoreCustomMetric IMAGE_ROWS = new StateStoreCustomSumMetric(
      "sparkStateImageRows", "spark_state: rows on local disk (sorted runs and the checkpoint's row image), looked up "
      + "there rather than held on the heap");
  static final StateStoreCustomMetric ROWS_LOADED = new StateStoreCustomSumMetric(
      "sparkStateRowsLoaded", "spark_state: rows decoded into the heap by the batch's load (when it opened a row "
      + "image: the changes after it, each key once; 0 when the version was held)");
  static final StateStoreCustomMetric BYTES_READ = new StateStoreCustomSumMetric(
      "sparkStateBytesRead", "spark_state: bytes of checkpoint files read from storage by the batch's load (chain "
      + "files, a downloaded row image or its tail, the changes after it)");
  static final StateStoreCustomMetric IMAGE_LOADS = new StateStoreCustomSumMetric(
      "sparkStateImageLoads", "spark_state: stores whose load opened the version's row image instead of decoding "
      + "its rows");
  static final StateStoreCustomMetric SPILLS = new StateStoreCustomSumMetric(
      "sparkStateSpills", "spark_state: times the batch wrote the rows it held on the heap to a run on local disk "
      + "(the memory budget was full)");
  static final StateStoreCustomMetric SPILLED_BYTES = new StateStoreCustomSumMetric(
      "sparkStateSpilledBytes", "spark_state: bytes those spills wrote to local disk");
  static final StateStoreCustomMetric RUNS = new StateStoreCustomSumMetric(
      "sparkStateRuns", "spark_state: sorted runs on local disk (a get of an existing key reads one of them; "
      + "background merges keep them few)");

  /** What {@code StateStoreProvider.supportedCustomMetrics} declares. */
  static final List<StateStoreCustomMetric> ALL = Arrays.asList(
      COMMIT_TIME, LOAD_TIME, BYTES_WRITTEN, WORKER_RESTARTS, MAINTENANCE_FAILURES, IMAGE_ROWS, ROWS_LOADED, BYTES_READ,
      IMAGE_LOADS, SPILLS, SPILLED_BYTES, RUNS);

  private Metrics() {}

  /** What the loads of a store's batch cost: time, rows decoded, bytes read from storage, row images opened. */
  record Load(long timeMs, long rows, long bytesRead, long images) {
    static final Load NONE = new Load(0, 0, 0, 0);

    Load plus(Load o) {
      return new Load(timeMs + o.timeMs, rows + o.rows, bytesRead + o.bytesRead, images + o.images);
    }
  }

  /**
   * What a load read after its store opened: a deferred restore's changes after its row image arrive with the
   * store's first use ({@code engine.DeferredRestore}). Held by the version loaded ({@code StateVersion}); the
   * first writable store on it that reports its metrics takes them.
   */
  static final class LateLoads {
    private Load pending = Load.NONE;

    synchronized void add(Load load) {
      pending = pending.plus(load);
    }

    /** What was added since the last call. */
    synchronized Load drain() {
      Load out = pending;
      pending = Load.NONE;
      return out;
    }
  }

  /** One store's metrics for its batch ({@code atStart}: the rows' stats when the batch began). */
  static StateStoreMetrics of(StateMap rows, LocalStats atStart, long commitTimeMs, Load load,
      long bytesWritten, long workerRestarts, long maintenanceFailures) {
    LocalStats now = rows.stats();
    Map<StateStoreCustomMetric, Object> custom = new HashMap<>();
    custom.put(ROWS_LOADED, load.rows());
    custom.put(BYTES_READ, load.bytesRead());
    custom.put(IMAGE_LOADS, load.images());
    custom.put(SPILLS, now.spills() - atStart.spills());
    custom.put(SPILLED_BYTES, now.spilledBytes() - atStart.spilledBytes());
    custom.put(RUNS, (long) now.runs());
    custom.put(COMMIT_TIME, commitTimeMs);
    custom.put(LOAD_TIME, load.timeMs());
    custom.put(BYTES_WRITTEN, bytesWritten);
    custom.put(WORKER_RESTARTS, workerRestarts);
    custom.put(MAINTENANCE_FAILURES, maintenanceFailures);
    custom.put(IMAGE_ROWS, now.diskRows());
    return SparkCompat.metrics(rows.size(), rows.bytes(), immutableMap(custom));
  }

  @SuppressWarnings({"unchecked", "rawtypes"})
  private static <K, V> scala.collection.immutable.Map<K, V> immutableMap(Map<K, V> m) {
    return (scala.collection.immutable.Map) scala.collection.immutable.Map$.MODULE$
        .from(CollectionConverters.asScala(m));
  }
}
