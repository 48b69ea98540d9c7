package io.sparkstate.shim;

import io.sparkstate.shim.engine.StateMap;

import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

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
      "sparkStateImageRows", "spark_state: rows looked up in row images on local disk instead of held on the heap");

  /** What {@code StateStoreProvider.supportedCustomMetrics} declares. */
  static final List<StateStoreCustomMetric> ALL = Arrays.asList(
      COMMIT_TIME, LOAD_TIME, BYTES_WRITTEN, WORKER_RESTARTS, MAINTENANCE_FAILURES, IMAGE_ROWS);

  private Metrics() {}

  /** One store's metrics for its batch. */
  static StateStoreMetrics of(StateMap rows, long commitTimeMs, long loadTimeMs, long bytesWritten,
      long workerRestarts, long maintenanceFailures) {
    Map<StateStoreCustomMetric, Object> custom = new HashMap<>();
    custom.put(COMMIT_TIME, commitTimeMs);
    custom.put(LOAD_TIME, loadTimeMs);
    custom.put(BYTES_WRITTEN, bytesWritten);
    custom.put(WORKER_RESTARTS, workerRestarts);
    custom.put(MAINTENANCE_FAILURES, maintenanceFailures);
    custom.put(IMAGE_ROWS, rows.imageRows());
    return SparkCompat.metrics(rows.size(), rows.bytes(), immutableMap(custom));
  }

  @SuppressWarnings({"unchecked", "rawtypes"})
  private static <K, V> scala.collection.immutable.Map<K, V> immutableMap(Map<K, V> m) {
    return (scala.collection.immutable.Map) scala.collection.immutable.Map$.MODULE$
        .from(CollectionConverters.asScala(m));
  }
}
