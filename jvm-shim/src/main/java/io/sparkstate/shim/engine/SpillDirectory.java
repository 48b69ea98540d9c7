package io.sparkstate.shim.engine;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Comparator;
import java.util.stream.Stream;

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
    removeLeftovers(Paths.get(root));
    return Paths.get(root, PREFIX + ProcessHandle.current().pid());
  }

  /**
   * Deletes the spill directories of executors that no longer run (a SIGKILL during a spill leaves its
   * half-written file: every other spill file is unlinked once open).
   */
  private static void removeLeftovers(Path root) {
    try (DirectoryStream<Path> dirs = Files.newDirectoryStream(root, PREFIX + "*")) {
      for (Path d : dirs) {
        String pid = d.getFileName().toString().substring(PREFIX.length());
        if (pid.matches("\\d+") && ProcessHandle.of(Long.parseLong(pid)).isEmpty()) {
          try (Stream<Path> files = Files.walk(d)) {
            files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
          }
        }
      }
    } catch (IOException | RuntimeException e) {
      // best effort: leftovers of dead executors only take disk space
    }
  }

  private static final String PREFIX = "spark-state-spill-";
}
