package io.sparkstate.shim;

import org.apache.spark.sql.execution.streaming.state.StateStore;

/**
 * The errors for Spark features spark_state does not implement, each naming what to use instead. Like
 * Spark's HDFSBackedStateStoreProvider, spark_state keeps single-value stores in the default column
 * family; transformWithState needs more and runs on RocksDB.
 */
final class Unsupported {
  private static final String ROCKSDB = "spark.sql.streaming.stateStore.providerClass="
      + "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider. " + wayOut();

  /**
   * How a query whose state is on spark_state moves to RocksDB (the only provider Spark runs
   * transformWithState on): its checkpoint is migrated, and the query restarts on the new one.
   */
  static String wayOut() {
    return "A query already running on spark_state keeps its state by moving its checkpoint to RocksDB: stop it, "
        + "run 'spark-state migrate <checkpoint> <new checkpoint> --to rocksdb' (or spark_state.migrate(..., "
        + "to=\"rocksdb\"), pyspark 4.2+) and start it on the new checkpoint; docs/operating.md, \"Moving to "
        + "transformWithState\", shows how an applyInPandasWithState query becomes transformWithStateInPandas with "
        + "its state as initialState.";
  }

  private Unsupported() {}

  /** Refuses a column family other than the default one. */
  static void checkColumnFamily(String name, Object provider) {
    if (name != null && !StateStore.DEFAULT_COL_FAMILY_NAME().equals(name)) {
      throw columnFamilies("column family '" + name + "'", provider);
    }
  }

  static UnsupportedOperationException columnFamilies(String what, Object provider) {
    return new UnsupportedOperationException("spark_state: " + what + " is not supported by " + provider
        + ": spark_state supports single-value stores in the default column family only (like Spark's "
        + "HDFSBackedStateStoreProvider). Multiple column families are used by transformWithState / "
        + "transformWithStateInPandas; run those with " + ROCKSDB);
  }

  static UnsupportedOperationException multipleValues(String what, Object provider) {
    return new UnsupportedOperationException("spark_state: " + what + " (multiple values per key) is not "
        + "supported by " + provider + ": spark_state supports single-value stores in the default column family "
        + "only (like Spark's HDFSBackedStateStoreProvider). Multiple values per key are used by "
        + "transformWithState / transformWithStateInPandas (ListState); run those with " + ROCKSDB);
  }

  static UnsupportedOperationException rangeScans(Object provider, Object encoderSpec) {
    return new UnsupportedOperationException("spark_state: " + provider + " does not support the key encoder "
        + encoderSpec + " (range scans); spark_state supports plain and prefix-scan keys.");
  }
}
