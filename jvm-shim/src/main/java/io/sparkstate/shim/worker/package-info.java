/**
 * The client of the executor's Python worker (docs/protocol.md), which owns the checkpoint:
 * {@link io.sparkstate.shim.worker.StoreClient} (one method per request of one store),
 * {@link io.sparkstate.shim.worker.ChangeStream} (a batch's changes streamed while it runs),
 * {@link io.sparkstate.shim.worker.WorkerClient} (the pool, retries, replacement), {@code WorkerConnection}
 * (frames), {@code WorkerProcess} (start and stop) and {@link io.sparkstate.shim.worker.Options}.
 */
package io.sparkstate.shim.worker;
