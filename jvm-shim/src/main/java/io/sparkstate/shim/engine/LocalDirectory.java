package io.sparkstate.shim.engine;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.stream.Stream;

import org.apache.spark.SparkEnv;
import org.apache.spark.util.Utils;

/**
 * This executor's folder on local disk: its spill runs ({@link #newSpillFile}) and its copies of remote row
 * images ({@link #images}). One per JVM, directly under one of Spark's configured local directories
 * ({@code spark.local.dir}, or the ones YARN and Kubernetes give), else {@code java.io.tmpdir}; not under the
 * {@code spark-<uuid>} folder Spark makes for each JVM, which no later executor looks into.
 *
 * <p>The JVM holds a lock on the folder's {@code .lock} for its life; the OS lets go of it when the process
 * ends, however it ends. The first use deletes every such folder whose lock can be taken: the folders of
 * executors that were killed (a SIGKILL runs no shutdown hook, and copies of images can be gigabytes), found
 * by the next executor of the application on the host (YARN and standalone give each application its own
 * local directories). A process id is no such test: containers sharing a disk reuse them. A folder gets its
 * name only once its lock is held, so no other executor ever sees it unlocked while its JVM runs. The lock
 * is an OS file lock: a local directory on NFS mounted without locks would look unlocked to every host.
 */
final class LocalDirectory {
  static final String PREFIX = "spark-state-local-";
  private static final String LOCK = ".lock";
  private static volatile LocalDirectory instance;
  /** Channels to lock files this JVM holds through another copy of these classes: closing one would unlock it. */
  private static final List<FileChannel> HELD_OPEN = Collections.synchronizedList(new ArrayList<>());

  final Path dir;
  /** Held for the JVM's life (never released: the OS does it). */
  @SuppressWarnings("unused")
  private final FileLock lock;

  /** The folder of this JVM: deleted when the JVM exits (a kill leaves it to the next executor's cleanup). */
  private LocalDirectory(Path dir, FileLock lock) {
    this.dir = dir;
    this.lock = lock;
    Runtime.getRuntime().addShutdownHook(new Thread(() -> deleteTree(dir), "spark-state-local-cleanup"));
  }

  static LocalDirectory get() {
    LocalDirectory d = instance;
    if (d == null) {
      synchronized (LocalDirectory.class) {
        if (instance == null) {
          instance = create();
        }
        d = instance;
      }
    }
    return d;
  }

  /** Where spill runs go (made again if a disk cleaner removed it). */
  Path spill() {
    return dir.resolve("spill");
  }

  /** Where the copies of remote row images go. */
  Path images() {
    return dir.resolve("images");
  }

  /** A new empty spill file (its directory made again if a disk cleaner removed it). */
  static Path newSpillFile() throws IOException {
    Path d = get().spill();
    Files.createDirectories(d);
    return Files.createTempFile(d, "state-", ".img");
  }

  private static LocalDirectory create() {
    List<Path> roots = roots();
    for (Path root : roots) {
      removeLeftovers(root);
    }
    String name = PREFIX + ProcessHandle.current().pid() + "-";
    Collections.shuffle(roots);   // spread executors over the disks, as Spark does; skip one that refuses
    for (Path root : roots) {
      LocalDirectory made = lockedFolder(root, name);
      if (made != null) {
        return made;
      }
    }
    // no disk gives a locked folder: one of this process all the same (a kill leaks it: no lock marks it dead)
    Path dir = roots.get(0).resolve(name + Long.toHexString(ThreadLocalRandom.current().nextLong() >>> 1));
    return new LocalDirectory(dir, null);
  }

  /**
   * A folder under {@code root} named once its lock is held (made under a dot name first, which no cleanup
   * looks at); null, leaving nothing behind, when the disk refuses the folder or the lock.
   */
  private static LocalDirectory lockedFolder(Path root, String name) {
    Path staging = null;
    FileChannel channel = null;
    try {
      Files.createDirectories(root);
      staging = Files.createTempDirectory(root, "." + name);
      channel = FileChannel.open(staging.resolve(LOCK), StandardOpenOption.CREATE, StandardOpenOption.WRITE);
      FileLock lock = channel.tryLock();   // never blocks (a lock daemon that does not answer)
      if (lock == null) {
        throw new IOException("the lock of a new folder is held by another process");
      }
      Path dir = root.resolve(name + staging.getFileName().toString().substring(1 + name.length()));
      Files.move(staging, dir, StandardCopyOption.ATOMIC_MOVE);
      return new LocalDirectory(dir, lock);
    } catch (IOException | RuntimeException e) {
      if (channel != null) {
        try {
          channel.close();
        } catch (IOException ignored) {
          // gone with the folder
        }
      }
      if (staging != null) {
        deleteTree(staging);
      }
      return null;
    }
  }

  /** Spark's configured local directories (every one is looked into for leftovers), else java.io.tmpdir. */
  private static List<Path> roots() {
    List<Path> roots = new ArrayList<>();
    try {
      SparkEnv env = SparkEnv.get();
      if (env != null) {
        for (String d : Utils.getConfiguredLocalDirs(env.conf())) {
          roots.add(Paths.get(d));
        }
      }
    } catch (RuntimeException e) {
      // no usable Spark local dir: the JVM's temp dir
    }
    if (roots.isEmpty()) {
      roots.add(Paths.get(System.getProperty("java.io.tmpdir")));
    }
    return roots;
  }

  /** Deletes the folders under {@code root} whose lock can be taken: their executors no longer run. */
  private static void removeLeftovers(Path root) {
    try (DirectoryStream<Path> dirs = Files.newDirectoryStream(root, PREFIX + "*")) {
      for (Path d : dirs) {
        Path lockFile = d.resolve(LOCK);
        if (!Files.isRegularFile(lockFile)) {
          continue;   // no lock file: not a folder this code made (it names a folder only once it is locked)
        }
        FileChannel channel;
        try {
          channel = FileChannel.open(lockFile, StandardOpenOption.WRITE);
        } catch (IOException | RuntimeException e) {
          continue;
        }
        boolean close = true;
        try {
          FileLock taken = channel.tryLock();
          if (taken != null) {
            deleteLeftover(d);
          }
        } catch (OverlappingFileLockException e) {
          // this JVM holds it (a second copy of these classes, another class loader): closing this channel
          // would drop that lock too (POSIX locks are the process's), so it stays open
          close = false;
          HELD_OPEN.add(channel);
        } catch (IOException | RuntimeException e) {
          // unreadable: not a leftover to delete
        } finally {
          if (close) {
            try {
              channel.close();   // lets go of the lock taken, after the folder went
            } catch (IOException ignored) {
              // nothing to flush
            }
          }
        }
      }
    } catch (IOException | RuntimeException e) {
      // best effort: leftovers of dead executors only take disk space
    }
  }

  /** A dead executor's folder, its lock file last: a folder that could not all go keeps it, to be tried again. */
  private static void deleteLeftover(Path d) throws IOException {
    try (Stream<Path> files = Files.walk(d)) {
      files.sorted(Comparator.reverseOrder()).filter(f -> !f.equals(d) && !f.equals(d.resolve(LOCK)))
          .forEach(f -> f.toFile().delete());
    }
    try (Stream<Path> left = Files.list(d)) {
      if (left.allMatch(f -> f.getFileName().toString().equals(LOCK))) {
        Files.deleteIfExists(d.resolve(LOCK));
        Files.deleteIfExists(d);
      }
    }
  }

  static void deleteTree(Path d) {
    try (Stream<Path> files = Files.walk(d)) {
      files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    } catch (IOException | RuntimeException e) {
      // best effort
    }
  }
}
