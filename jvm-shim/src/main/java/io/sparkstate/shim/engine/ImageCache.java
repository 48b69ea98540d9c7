package io.sparkstate.shim.engine;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The executor's local copies of row images that live on remote checkpoint storage (issue 38): one sparse
 * file per image in the executor's local folder ({@link LocalDirectory}, on a disk of Spark's), shared by
 * every store of the executor, bounded in bytes ({@code rowImages.cacheSize}; default half the free space
 * of that disk), evicting the least recently used images no store reads. A store restored over a remote
 * image reads the pages its lookups need by range (through the worker) and the rest arrives in the
 * background: a few fill loops per image, each fetching up to {@link #FILL_BYTES} per request in ranges of
 * {@link #RANGE_BYTES} that the worker reads at once. The copies are a cache: they may be evicted, lost or
 * damaged at any moment and are fetched again (see {@link CachedImage}); the folder is deleted when the
 * JVM exits, and the next executor on the host deletes the folder of one that was killed.
 */
final class ImageCache {
  private static final Logger LOG = LoggerFactory.getLogger(ImageCache.class);
  /** Bytes of the unit the copies are kept in: a lookup's miss fetches the pages under its block. */
  static final int PAGE = Math.max(4096, Integer.getInteger("spark_state.imageCachePage", 64 << 10));
  /**
   * Largest range of one request (the worker reads a request's ranges at once): a fill request is one range,
   * the size S3's guidelines name for range GETs (8 or 16 MB). Every GET costs the store a request's work
   * whatever its size: 1 MiB ranges made the fill 8 times the requests, and on the loopback test server
   * twice the CPU of a download (benchmarks/results/remote-restore/).
   */
  static final long RANGE_BYTES = Math.max(PAGE, Long.getLong("spark_state.imageFillRange", 8L << 20));
  /** Bytes one fill request asks for. */
  static final long FILL_BYTES = Math.max(RANGE_BYTES, Long.getLong("spark_state.imageFillBytes", 8L << 20));
  /** Fill loops per image (0: no background fill, tests). */
  static final int FILL_STREAMS = Math.max(0, Integer.getInteger("spark_state.imageFillStreams", 2));
  /**
   * Milliseconds after a restore when its image's key filter and fill start if no lookup started them
   * earlier (the first read that reaches the copy does): the restore and its first lookup go before the
   * megabytes, and an image nothing reads soon is not fetched at once.
   */
  static final long FILL_DELAY_MS = Math.max(0, Long.getLong("spark_state.imageFillDelayMs", 200));
  /** Fill threads of the executor (every image's loops share them). */
  static final int FILL_THREADS = Math.max(1, Integer.getInteger("spark_state.imageFillThreads", 4));
  /** Idle images whose page states the cache remembers at most (their files' pages count against the bound). */
  static final int MAX_IDLE = 1024;

  private final Map<String, CachedImage> images = new HashMap<>();
  private final ExecutorService fill = Executors.newFixedThreadPool(FILL_THREADS, r -> {
    Thread t = new Thread(r, "spark-state-image-fill");
    t.setDaemon(true);
    return t;
  });
  /** The bound set by the option, or -1: the default (computed when first needed). */
  private long capacity = -1;
  private long defaultCapacity = -1;
  private long used;
  private Path dir;
  private boolean writesFailed;
  private final AtomicLong fetched = new AtomicLong();
  private final AtomicLong requests = new AtomicLong();

  /** The bound in bytes ({@code rowImages.cacheSize}); null: the default, half the free space of the disk. */
  synchronized void setCapacity(Long bytes) {
    capacity = bytes == null ? -1 : Math.max(0, bytes);
  }

  synchronized long capacity() {
    if (capacity >= 0) {
      return capacity;
    }
    if (defaultCapacity < 0) {
      try {
        Path d = directory();
        Files.createDirectories(d);
        defaultCapacity = Files.getFileStore(d).getUsableSpace() / 2;
      } catch (IOException | RuntimeException e) {
        defaultCapacity = 0;
        LOG.warn("spark_state: cannot size the local cache of remote row images ({}); their blocks are fetched "
            + "each time they are read", e.toString());
      }
    }
    return defaultCapacity;
  }

  /** Bytes of pages the copies hold or are fetching. */
  synchronized long usedBytes() {
    return used;
  }

  /** Bytes and requests the cache's readers fetched from the checkpoint storage (metrics, benchmarks). */
  long fetchedBytes() {
    return fetched.get();
  }

  long fetchRequests() {
    return requests.get();
  }

  /** Where the copies live: this executor's local folder ({@link LocalDirectory}). */
  synchronized Path directory() {
    if (dir == null) {
      dir = LocalDirectory.get().images();
    }
    return dir;
  }

  /**
   * A source of a remote image's bytes for one store: its copy (made, or the one another store or an earlier
   * restore of this one left), the tail the load sent, and the reader of the ranges it fetches.
   */
  RemoteSource open(RemoteImage remote) throws IOException {
    CachedImage image = acquire(remote);
    return new RemoteSource(this, image, remote);
  }

  private synchronized CachedImage acquire(RemoteImage remote) throws IOException {
    String key = remote.key();
    CachedImage image = images.get(key);
    if (image == null || image.dropped) {
      image = new CachedImage(this, key, remote.id, remote.size, directory().resolve(fileName(key)), PAGE);
      images.put(key, image);
    }
    if (image.users == 0) {
      release(image, image.resetIfLost());
      image.openFile();
    }
    image.users++;
    image.lastUse = System.nanoTime();
    trimIdle();
    return image;
  }

  /** A store stopped reading the image: its file closes when no store reads it (its pages stay, evictable). */
  synchronized void release(CachedImage image) {
    if (--image.users == 0) {
      image.lastUse = System.nanoTime();
      image.closeFile();
    }
  }

  /**
   * Room for {@code bytes} more of {@code image}'s pages: evicts the least recently used images no store
   * reads until they fit. False when they do not fit (the caller reads the bytes without keeping them).
   */
  synchronized boolean reserve(CachedImage image, long bytes) {
    if (writesFailed || image.dropped || image.users == 0) {   // an idle image's fill stops here
      return false;
    }
    long cap = capacity();
    if (used + bytes > cap) {
      long idle = 0;
      for (CachedImage c : images.values()) {
        idle += c != image && c.users == 0 ? c.reserved : 0;
      }
      if (used - idle + bytes > cap) {
        return noRoom(image, cap);   // evicting every idle image would not make room: keep them for later restores
      }
    }
    while (used + bytes > cap) {
      CachedImage victim = null;
      for (CachedImage c : images.values()) {
        if (c != image && c.users == 0 && c.reserved > 0 && (victim == null || c.lastUse < victim.lastUse)) {
          victim = c;
        }
      }
      if (victim == null) {
        return noRoom(image, cap);
      }
      evict(victim);
    }
    used += bytes;
    image.reserved += bytes;
    return true;
  }

  /**
   * The images being read fill the cache: {@code image}'s missing pages are fetched each time a lookup reads
   * them, and its fill stops. Said once per image, as a request per block read is what a batch then costs.
   */
  private boolean noRoom(CachedImage image, long cap) {
    if (!image.noRoomLogged) {
      image.noRoomLogged = true;
      LOG.warn("spark_state: the local cache of remote row images is full ({} MiB used of {} MiB, option "
          + "rowImages.cacheSize, default half the free space of spark.local.dir's disk) with images stores are "
          + "reading; the missing blocks of {} ({} MiB) are fetched from checkpoint storage each time a lookup "
          + "reads them", used >> 20, cap >> 20, image.name, image.size >> 20);
    }
    return false;
  }

  /** Pages of {@code image} that went missing again give their room back. */
  synchronized void unreserve(CachedImage image, long bytes) {
    release(image, bytes);
  }

  private void release(CachedImage image, long bytes) {
    long n = Math.min(bytes, image.reserved);
    image.reserved -= n;
    used -= n;
  }

  private void evict(CachedImage victim) {
    LOG.info("spark_state: evicting the local copy of the row image {} ({} MiB) from the cache of remote images "
        + "({} MiB used of {} MiB)", victim.name, victim.reserved >> 20, used >> 20, capacity() >> 20);
    remove(victim);
  }

  /** Drops the copy of the image with this key (see {@link RemoteImage#key}) if no store reads it: the warm-up's. */
  synchronized void discard(String key) {
    CachedImage image = images.get(key);
    if (image != null && image.users == 0) {
      remove(image);
    }
  }

  private void remove(CachedImage victim) {
    victim.drop();
    used -= victim.reserved;
    victim.reserved = 0;
    victim.dropped = true;
    images.remove(victim.key);
  }

  /** Forgets the oldest idle images beyond {@link #MAX_IDLE} (their files too). */
  private void trimIdle() {
    int idle = 0;
    for (CachedImage c : images.values()) {
      idle += c.users == 0 ? 1 : 0;
    }
    while (idle-- > MAX_IDLE) {
      CachedImage oldest = null;
      for (CachedImage c : images.values()) {
        if (c.users == 0 && (oldest == null || c.lastUse < oldest.lastUse)) {
          oldest = c;
        }
      }
      evict(oldest);
    }
  }

  /** Local disk refused a copy's bytes: the cache stops keeping copies (reads fetch what they need). */
  synchronized void writeFailed(Path file, IOException e) {
    if (!writesFailed) {
      writesFailed = true;
      LOG.warn("spark_state: cannot write the local copy {} of a remote row image ({}); blocks of remote images "
          + "are fetched each time they are read from now on", file, e.toString());
    }
  }

  /** Counts a request the cache's readers sent and the bytes it asked for. */
  void counted(long bytes) {
    requests.incrementAndGet();
    fetched.addAndGet(bytes);
  }

  /** Whether a store reads the image (its fill goes on while one does). */
  synchronized boolean inUse(CachedImage image) {
    return image.users > 0 && !image.dropped;
  }

  /** Runs a job of a remote image on the fill threads (its key filter). */
  void submit(Runnable job) {
    fill.execute(job);
  }

  /** Runs a job on the fill threads {@code ms} from now. */
  void submitLater(Runnable job, long ms) {
    CompletableFuture.runAsync(job, CompletableFuture.delayedExecutor(ms, TimeUnit.MILLISECONDS, fill));
  }

  /** Starts the background fill of an image: up to {@link #FILL_STREAMS} loops, each until nothing is missing. */
  void fill(CachedImage image, RangeReader reader) {
    for (int i = 0; i < FILL_STREAMS; i++) {
      if (!image.startFiller()) {
        return;
      }
      fill.execute(() -> {
        try {
          while (inUse(image) && image.fillStep(reader)) {
            // next step
          }
        } catch (IOException | RuntimeException e) {
          if (inUse(image)) {
            LOG.warn("spark_state: the background fetch of the row image {} stopped ({}); its blocks are fetched "
                + "when lookups need them", image.name, e.toString());
          }
        } finally {
          image.fillerDone();
        }
      });
    }
  }

  /** Each copy: the checkpoint's file, the local file, pages present, pages, stores reading it (tests). */
  synchronized java.util.List<String> describe() {
    java.util.List<String> out = new java.util.ArrayList<>();
    for (CachedImage c : images.values()) {
      int[] counts = c.pageCounts();
      out.add(c.name + " " + c.file + " " + counts[0] + " " + counts[1] + " " + c.users + " " + c.reserved);
    }
    return out;
  }

  private static String fileName(String key) {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256").digest(key.getBytes(StandardCharsets.UTF_8));
      StringBuilder sb = new StringBuilder();
      for (int i = 0; i < 16; i++) {
        sb.append(String.format("%02x", digest[i]));
      }
      return sb.append(".img").toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
