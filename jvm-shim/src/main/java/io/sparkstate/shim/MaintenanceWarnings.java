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
  public void onQueryTerminated(QueryTerminatedEvent event) {}
}
