/**
 * The executor-local tier (DESIGN.md, "Round 4"): each store's rows in this JVM, as an engine behind
 * one interface, {@link io.sparkstate.shim.engine.StateMap}, made by {@link io.sparkstate.shim.engine.Engine}
 * (empty, or restored over a row image of the checkpoint: {@link io.sparkstate.shim.engine.Restore}).
 * Everything here is derived from the checkpoint and may be dropped at any moment: a damaged or vanished
 * local file costs a reload or a clear task failure ({@link io.sparkstate.shim.engine.RowImageException}),
 * never wrong state.
 *
 * <p>Inside, RocksDB's split: the file format ({@code RowImage}, {@code RowImageWriter}, the
 * {@code BlockCache} they read through) apart from the store built on it ({@code LayeredMap}: the in-heap
 * {@code RowArena}s over sorted {@code Run}s on local disk, merged in the background; a {@code PrefixIndex}
 * for stores scanned by key prefix).
 */
package io.sparkstate.shim.engine;
