package io.sparkstate.shim;

import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;

/**
 * The Spark calls whose shape differs between Spark 4.0 and 4.3, looked up once by reflection so
 * that one jar (compiled against 4.3) links on every supported version. Everything else the shim
 * uses has the same signature in 4.0–4.3; interface members that only some versions declare are
 * implemented on the classes without {@code @Override}.
 *
 * <ul>
 *   <li>{@code StateStoreMetrics}: 3 arguments in 4.0, a 4th (instance metrics) from 4.1.</li>
 *   <li>{@code StateStoreConf.commitValidationEnabled} and
 *       {@code StateStore.reportCommitToCoordinator}: from 4.1.</li>
 * </ul>
 */
final class SparkCompat {
  private static final Constructor<StateStoreMetrics> METRICS = metricsConstructor();
  private static final Method COMMIT_VALIDATION = method(StateStoreConf.class, "commitValidationEnabled");
  private static final Method REPORT_COMMIT = method(StateStore.class, "reportCommitToCoordinator",
      long.class, StateStoreId.class, Configuration.class);

  private SparkCompat() {}

  /** {@code StateStoreMetrics(numKeys, memoryBytes, custom[, no instance metrics])}. */
  static StateStoreMetrics metrics(long numKeys, long memoryBytes,
      scala.collection.immutable.Map<StateStoreCustomMetric, Object> custom) {
    Object[] args = METRICS.getParameterCount() == 4
        ? new Object[] {numKeys, memoryBytes, custom, scala.collection.immutable.Map$.MODULE$.empty()}
        : new Object[] {numKeys, memoryBytes, custom};
    try {
      return METRICS.newInstance(args);
    } catch (InvocationTargetException e) {
      throw rethrow(e);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("spark_state: cannot create StateStoreMetrics on this Spark version", e);
    }
  }

  /** Reports a commit to the coordinator when the Spark version validates commits and it is enabled. */
  static void reportCommitIfValidating(StateStoreConf conf, long version, StateStoreId id, Configuration hadoopConf) {
    if (COMMIT_VALIDATION == null || REPORT_COMMIT == null) {
      return; // Spark 4.0: no commit validation
    }
    try {
      if ((Boolean) COMMIT_VALIDATION.invoke(conf)) {
        REPORT_COMMIT.invoke(null, version, id, hadoopConf);
      }
    } catch (InvocationTargetException e) {
      throw rethrow(e);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException("spark_state: cannot report a commit to the coordinator", e);
    }
  }

  @SuppressWarnings("unchecked")
  private static Constructor<StateStoreMetrics> metricsConstructor() {
    Constructor<StateStoreMetrics> best = null;
    for (Constructor<?> c : StateStoreMetrics.class.getConstructors()) {
      int n = c.getParameterCount();
      if ((n == 3 || n == 4) && (best == null || n > best.getParameterCount())) {
        best = (Constructor<StateStoreMetrics>) c;
      }
    }
    if (best == null) {
      throw new IllegalStateException("spark_state: this Spark version's StateStoreMetrics has no 3- or "
          + "4-argument constructor; spark_state supports Spark 4.0 to 4.3.");
    }
    return best;
  }

  private static Method method(Class<?> owner, String name, Class<?>... types) {
    try {
      return owner.getMethod(name, types);
    } catch (NoSuchMethodException e) {
      return null;
    }
  }

  private static RuntimeException rethrow(InvocationTargetException e) {
    Throwable cause = e.getCause();
    if (cause instanceof RuntimeException) {
      return (RuntimeException) cause;
    }
    if (cause instanceof Error) {
      throw (Error) cause;
    }
    return new IllegalStateException(cause);
  }
}
