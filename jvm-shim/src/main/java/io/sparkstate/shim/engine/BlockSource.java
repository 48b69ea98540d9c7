package io.sparkstate.shim.engine;

import java.io.Closeable;
import java.io.IOException;
import java.nio.file.Path;

/**
 * Where a {@link RowImage} reads its bytes: a file on local disk ({@link FileSource}: spill runs, the
 * checkpoint's own file on a local or NFS checkpoint), or an image on remote checkpoint storage read by
 * byte range through the executor's {@link ImageCache} ({@link RemoteSource}). Thread-safe.
 */
interface BlockSource extends Closeable {
  /** Bytes of the image. */
  long size() throws IOException;

  /**
   * Bytes [position, position + length) in a new array (rows may point into it). EOFException: the file
   * ends before them.
   */
  byte[] read(long position, int length) throws IOException;

  /**
   * The same bytes again from the checkpoint itself, past any local copy (they failed a check): null when
   * this source has no other copy (a local file is its own truth).
   */
  default byte[] reread(long position, int length) throws IOException {
    return null;
  }

  /** The ranges [from[i], to[i]) will be read soon: fetch in one go what is not local yet (a remote image). */
  default void prefetch(long[] from, long[] to) throws IOException {
  }

  /**
   * A lookup or cursor has the bytes of blocks it read (not an index page's): a remote image's background work
   * starts then, so the first lookup's index page and block never queue behind it.
   */
  default void blocksRead() {
  }

  /**
   * Until {@link #resumeBackground}, {@link #blocksRead} starts nothing (a restore's first lookup, run ahead of its
   * changes, must not have the fill compete with their transfer); then it starts what it would have.
   */
  default void holdBackground() {
  }

  /** Ends {@link #holdBackground}. */
  default void resumeBackground() {
  }

  /** Whether a read may wait on the network: the image then loads its key filter in the background. */
  default boolean remote() {
    return false;
  }

  /** Runs {@code job} off the caller's thread, before the image's background fill (a remote source). */
  default void background(Runnable job) {
    job.run();
  }

  /** How messages name the image (the checkpoint's file for a remote one). */
  String name();

  /** The local file holding the bytes (for a remote image, the cache's copy). */
  Path path();
}
