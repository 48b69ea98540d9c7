/**
 * The one budget of everything spark_state holds in an executor JVM: {@link
 * io.sparkstate.shim.memory.MemoryBudget} adds up the {@link io.sparkstate.shim.memory.Reservation}s its
 * holders keep; each holder gives memory back in its own way. A leaf: it uses nothing else of the shim.
 */
package io.sparkstate.shim.memory;
