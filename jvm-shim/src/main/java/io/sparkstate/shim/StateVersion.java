package io.sparkstate.shim;

import io.sparkstate.shim.codec.RowFormat;
import io.sparkstate.shim.engine.StateMap;

/**
 * A committed version of a store as this JVM holds it: its rows and which commit they are
 * (docs/consistency.md). Immutable; the open store changes {@link #rows} in place, so once a batch
 * starts the rows are those of the next version, and the provider replaces this value at commit or
 * drops it at abort.
 */
final class StateVersion {
  final StateMap rows;
  final long version;
  /** Identity of the commit storage holds for {@link #version} (null for version 0). */
  final String commitId;
  /**
   * Whether storage holds this version in typed files (format 2); false: opaque (format 1). Version 0
   * has no files and takes either. A provider of the other format ships its next version whole, as
   * its changes cannot build on these files.
   */
  final boolean typedFiles;
  /**
   * What loading this version read after its store opened (a deferred restore's changes after its row image,
   * {@code engine.DeferredRestore}), for the metrics of the first writable store on it; null: nothing comes
   * late. Dropped with the version (an aborted attempt's share is not its retry's).
   */
  final Metrics.LateLoads lateLoads;

  StateVersion(StateMap rows, long version, String commitId, boolean typedFiles) {
    this(rows, version, commitId, typedFiles, null);
  }

  StateVersion(StateMap rows, long version, String commitId, boolean typedFiles, Metrics.LateLoads lateLoads) {
    this.rows = rows;
    this.version = version;
    this.commitId = commitId;
    this.typedFiles = typedFiles;
    this.lateLoads = lateLoads;
  }

  /** Whether a provider writing this format must ship the next version whole. */
  boolean needsWholeCommit(RowFormat format) {
    return version > 0 && typedFiles != format.typed();
  }

  /** The version that committing these rows made. */
  StateVersion next(String newCommitId, boolean typed) {
    return new StateVersion(rows, version + 1, newCommitId, typed);
  }
}
