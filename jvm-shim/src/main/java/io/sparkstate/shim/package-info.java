/**
 * spark_state's JVM shim: Spark's state store provider. This package is the Spark-facing layer, thin on
 * purpose; the work happens in the packages beside it, which use only the two leaves {@code memory} and
 * {@code schema} (and the worker client the codec):
 *
 * <ul>
 *   <li><b>here, Spark's side</b>: {@link io.sparkstate.shim.SparkStateProvider} (the live version,
 *       getStore, load, commit, maintenance), the stores {@link io.sparkstate.shim.SparkStateStore} and
 *       {@link io.sparkstate.shim.SparkStateReadStore} over {@link io.sparkstate.shim.StoreView},
 *       {@link io.sparkstate.shim.StateVersion} (a version's rows and commit id),
 *       {@link io.sparkstate.shim.ChangeFeed} (Spark's change feed and snapshot replay),
 *       {@link io.sparkstate.shim.Metrics}, {@link io.sparkstate.shim.Unsupported},
 *       {@link io.sparkstate.shim.SparkCompat} (Spark 4.0–4.3), {@link io.sparkstate.shim.SparkStatePlugin},
 *       {@link io.sparkstate.shim.MaintenanceWarnings} and the migration tool
 *       {@link io.sparkstate.shim.ProviderStoreWriter}.</li>
 *   <li>{@link io.sparkstate.shim.engine}: the executor-local tier, a cache of the checkpoint's truth
 *       (rows in the heap, row images, runs, filters, the block cache, spills).</li>
 *   <li>{@link io.sparkstate.shim.codec}: rows on the wire (Arrow streams of docs/protocol.md, a
 *       batch's change log, Spark's key hash).</li>
 *   <li>{@link io.sparkstate.shim.worker}: the Python worker's client (requests, connections, the
 *       process, streamed commits, options).</li>
 *   <li>{@link io.sparkstate.shim.memory}: the one memory budget everything above charges.</li>
 *   <li>{@link io.sparkstate.shim.schema}: what is kept per schema (generated code, bounded) and a key's
 *       leading columns as that code reads them.</li>
 * </ul>
 */
package io.sparkstate.shim;
