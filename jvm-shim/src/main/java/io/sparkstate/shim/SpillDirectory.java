package io.sparkstate.shim;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

import org.apache.spark.SparkEnv;
import org.apache.spark.util.Utils;

/**
 * Where this executor's stores write local row images (spills, and nothing else): a directory under one
 * of Spark's local directories ({@code spark.local.dir}, the disks Spark spills shuffles to), else under
 * {@code java.io.tmpdir}. Files are unlinked as soon as they are open, so a dead executor leaves none.
 */
final class SpillDirectory {
  private static volatile Path dir;

  private SpillDirectory() {}

  static Path get() {
    Path d = dir;
    if (d == null) {
      synchronized (SpillDirectory.class) {
        if (dir == null) {
          dir = choose();
        }
        d = dir;
      }
    }
    return d;
  }

  /** A new empty file in the directory (created again if a disk cleaner removed it). */
  static Path newFile() throws IOException {
    Path d = get();
    Files.createDirectories(d);
    return Files.createTempFile(d, "state-", ".img");
  }

  private static Path choose() {
    String root = System.getProperty("java.io.tmpdir");
    try {
      SparkEnv env = SparkEnv.get();
      if (env != null) {
        root = Utils.getLocalDir(env.conf());
      }
    } catch (RuntimeException e) {
      // no usable Spark local dir: the JVM's temp dir
    }
    return Paths.get(root, "spark-state-" + ProcessHandle.current().pid());
  }
}
