/**
 * spark_state's JVM shim: Spark's state store provider, holding each partition's live state in this
 * JVM and shipping commits to the executor's Python worker, which owns storage (README, "How it
 * works"). One package, four parts:
 *
 * <ul>
 *   <li><b>Spark's side</b>: {@link io.sparkstate.shim.SparkStateProvider} (the live version, getStore,
 *       commit, maintenance), the stores {@link io.sparkstate.shim.SparkStateStore} and
 *       {@link io.sparkstate.shim.SparkStateReadStore} over {@link io.sparkstate.shim.StoreView},
 *       {@link io.sparkstate.shim.Metrics}, {@link io.sparkstate.shim.Unsupported},
 *       {@link io.sparkstate.shim.SparkCompat} (Spark 4.0–4.3), {@link io.sparkstate.shim.SparkStatePlugin}
 *       and {@link io.sparkstate.shim.MaintenanceWarnings}.</li>
 *   <li><b>Rows in the JVM</b>: {@link io.sparkstate.shim.StateVersion} (a version's rows and commit id)
 *       and {@link io.sparkstate.shim.StateMap}, the one interface the stores read and write through:
 *       {@link io.sparkstate.shim.RowArena}, {@link io.sparkstate.shim.PrefixScanMap} with
 *       {@link io.sparkstate.shim.PrefixIndex}.</li>
 *   <li><b>Rows on the wire</b>: {@link io.sparkstate.shim.RowFormat} (typed or opaque, chosen once per
 *       provider), a batch's {@link io.sparkstate.shim.ChangeLog} ({@link io.sparkstate.shim.ArrowChangeLog},
 *       {@link io.sparkstate.shim.MapChangeLog}), the encoders {@link io.sparkstate.shim.TypedCodec},
 *       {@link io.sparkstate.shim.FlatStructWriter} and {@link io.sparkstate.shim.ArrowCodec}, and
 *       {@link io.sparkstate.shim.KeyHasher} (Spark's partition hash, key groups).</li>
 *   <li><b>The worker</b> (docs/protocol.md): {@link io.sparkstate.shim.StoreClient} (the requests, one
 *       method per op), {@link io.sparkstate.shim.ChangeFeed} (a store's history for Spark's change feed
 *       and snapshot replay), {@link io.sparkstate.shim.WorkerClient} (the pool, retries, replacement),
 *       {@link io.sparkstate.shim.WorkerConnection} (frames), {@link io.sparkstate.shim.WorkerProcess}
 *       (start and stop), {@link io.sparkstate.shim.Options}.</li>
 * </ul>
 */
package io.sparkstate.shim;
