package io.sparkstate.shim;

import java.util.Map;

import org.apache.spark.sql.streaming.StateOperatorProgress;
import org.apache.spark.sql.streaming.StreamingQueryListener;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Driver-side listener ({@code spark.sql.streaming.streamingQueryListeners}, set by
 * {@code spark_state.configure()}): background maintenance runs on executors, where a failure is
 * only an executor log line; this puts a warning in the driver's log when a batch's progress
 * reports stores whose maintenance keeps failing, so a stalled retention does not go unnoticed.
 * When a query ends with Spark's refusal of a feature only RocksDB has (transformWithState), it
 * logs the way a spark_state query moves to RocksDB ({@link #advice}): Spark's message cannot say it.
 */
public class MaintenanceWarnings extends StreamingQueryListener {
  /** The custom metric every spark_state store reports: its consecutive failed maintenance runs. */
  static final String METRIC = "sparkStateMaintenanceFailures";
  private static final Logger LOG = LoggerFactory.getLogger(MaintenanceWarnings.class);

  @Override
  public void onQueryStarted(QueryStartedEvent event) {}

  @Override
  public void onQueryProgress(QueryProgressEvent event) {
    for (StateOperatorProgress op : event.progress().stateOperators()) {
      Map<String, Long> metrics = op.customMetrics();
      Long failures = metrics == null ? null : metrics.get(METRIC);
      if (failures != null && failures > 0) {
        LOG.warn("spark_state: query '{}' ({}), batch {}: state operator {} reports {} failed background "
            + "maintenance run(s) (compaction/retention) across its stores; old state files are not being "
            + "cleaned up. Each store and its error are logged on the executors as 'spark_state: maintenance "
            + "of <store> failed'.", event.progress().name(), event.progress().id(), event.progress().batchId(),
            op.operatorName(), failures);
      }
    }
  }

  @Override
  public void onQueryTerminated(QueryTerminatedEvent event) {
    String advice = event.exception().isDefined() ? advice(event.exception().get()) : null;
    if (advice != null) {
      LOG.warn("spark_state: query {} failed because {}", event.id(), advice);
    }
  }

  /**
   * What to do about a query that failed with {@code exception} (its message), or null when spark_state
   * has nothing to add: Spark refuses transformWithState on every provider but RocksDB
   * ({@code STORE_BACKEND_NOT_SUPPORTED_FOR_TWS}), and its message does not say how a query keeps its state.
   */
  public static String advice(String exception) {
    if (exception == null || !exception.contains("STORE_BACKEND_NOT_SUPPORTED_FOR_TWS")) {
      return null;
    }
    return "Spark runs transformWithState / transformWithStateInPandas on its RocksDB provider only. Run such a "
        + "query in a session with spark.sql.streaming.stateStore.providerClass="
        + "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider. " + Unsupported.wayOut();
  }
}
