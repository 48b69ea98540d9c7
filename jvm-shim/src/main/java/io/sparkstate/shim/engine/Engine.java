package io.sparkstate.shim.engine;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;

import io.sparkstate.shim.memory.MemoryBudget;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The executor's local tier: the memory budget its stores share, the block cache of their row
 * images, the directory they spill to. Everything here is derived from the checkpoint and may be
 * dropped at any moment. One per executor JVM ({@link #executor}); tests make their own.
 */
public final class Engine {
  private static final Logger LOG = LoggerFactory.getLogger(Engine.class);
  private static final Engine EXECUTOR = new Engine(MemoryBudget.executor());

  /** Spills of an executor after which it says, once, that state rows spill (WARN: Spark's default level). */
  static final int SPILLS_BEFORE_NOTICE = 3;

  private final MemoryBudget budget;
  private final BlockCache cache;
  /** Local copies of row images on remote checkpoint storage (local disk, not the budget). */
  private final ImageCache images = new ImageCache();
  /** Background merges of runs: one thread for the executor, so merges never take more than a core. */
  private final ExecutorService merger = Executors.newSingleThreadExecutor(r -> {
    Thread t = new Thread(r, "spark-state-merge");
    t.setDaemon(true);
    t.setPriority(Thread.NORM_PRIORITY - 1);
    return t;
  });
  /**
   * Lookups in a restore's image started while its changes are on their way ({@link DeferredRestore}): a thread
   * per such first lookup, briefly; never queued behind fills.
   */
  private final ExecutorService lookups = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "spark-state-first-lookup");
    t.setDaemon(true);
    return t;
  });
  private final AtomicLong spills = new AtomicLong();
  private final AtomicLong spilledBytes = new AtomicLong();
  private volatile boolean warmedUp;

  public Engine(MemoryBudget budget) {
    this.budget = budget;
    this.cache = new BlockCache(budget);
  }

  public static Engine executor() {
    return EXECUTOR;
  }

  public MemoryBudget budget() {
    return budget;
  }

  BlockCache cache() {
    return cache;
  }

  ImageCache images() {
    return images;
  }

  /**
   * The bound of the local disk the copies of remote row images may take, all stores together (the option
   * {@code rowImages.cacheSize}); null: half the free space of the disk under {@code spark.local.dir}.
   */
  public void setImageCacheSize(Long bytes) {
    images.setCapacity(bytes);
  }

  /** Bytes and requests restores over remote row images fetched from the checkpoint storage so far. */
  public long[] remoteFetches() {
    return new long[] {images.fetchedBytes(), images.fetchRequests()};
  }

  /**
   * A new empty file under the executor's local directories (Spark's {@code spark.local.dir}), for data the
   * caller unlinks once open (spooled changes).
   */
  public Path newLocalFile() throws IOException {
    return LocalDirectory.newSpillFile();
  }

  private static PrefixIndex prefixIndex(StoreSpec spec) {
    return spec.prefixColumns() > 0 ? new PrefixIndex(spec.keySchema(), spec.prefixColumns()) : null;
  }

  /** Runs {@code job} on the merge thread. */
  void merge(Runnable job) {
    merger.execute(job);
  }

  /**
   * A store spilled {@code heapBytes} of rows into {@code fileBytes} of runs. The executor's first few
   * spills are part of life with state larger than memory; from the third on the executor says so once,
   * at WARN, with the option that changes it.
   */
  void spilled(long heapBytes, long fileBytes) {
    long n = spills.incrementAndGet();
    spilledBytes.addAndGet(fileBytes);
    if (n == SPILLS_BEFORE_NOTICE) {
      LOG.warn("spark_state: state rows spill to local disk ({} spills, {} written so far; memory budget {}, "
          + "in use {}). Expected when the state is larger than the budget; if batches slow down, raise "
          + "spark.sql.streaming.stateStore.sparkState.memoryLimit or the executor memory. The progress metrics "
          + "sparkStateSpills and sparkStateSpilledBytes count them.", n, MemoryBudget.size(spilledBytes.get()),
          MemoryBudget.size(budget.limit()), budget.describeUse());
    }
  }

  /** Spills of every store of this engine so far. */
  public long spills() {
    return spills.get();
  }

  /** An empty store for about {@code expectedRows} keys. */
  public StateMap newStore(StoreSpec spec, long expectedRows) {
    return new LayeredMap(spec.keyFields(), spec.valueFields(), expectedRows, spec.order(), this, spec.onDamage(),
        prefixIndex(spec));
  }

  /**
   * A store restored over the checkpoint's row image at {@code path} (a whole state of {@code rows} keys):
   * the image is opened (its trailer and index read and checked) and the caller applies the changes after
   * it. Null, logged, when the image cannot be used (the caller loads the rows instead: an image is never
   * the truth). A {@code temporary} copy is unlinked once open (it is read through its descriptor).
   */
  public Restore restore(StoreSpec spec, Path path, long rows, boolean temporary, long expectedChanges) {
    RowImage image;
    try {
      image = RowImage.open(path, spec.keyFields(), spec.valueFields(), cache, true);
      if (image.rows() != rows || image.hasTombstones()) {
        image.close();
        throw RowImageException.corrupt(path, image.rows() + " records where the snapshot holds " + rows + " rows");
      }
    } catch (IOException | RuntimeException e) {
      LOG.warn("spark_state: cannot use the row image {} ({}); loading the version's rows instead", path,
          e.toString());
      return null;
    } finally {
      if (temporary) {
        try {
          Files.deleteIfExists(path);
        } catch (IOException e) {
          LOG.warn("spark_state: cannot delete the downloaded row image {}: {}", path, e.toString());
        }
      }
    }
    return restored(spec, image, rows, expectedChanges);
  }

  /**
   * A store restored over a row image on remote checkpoint storage (issue 38): opened from the tail its load
   * sent (no request), its blocks read by range through the executor's {@link ImageCache} as lookups need
   * them, its key filter and the rest of its bytes fetched into the local copy in the background once its
   * first lookup has its block (or {@link ImageCache#FILL_DELAY_MS} after the open). Null, logged, when the
   * image cannot be used (the caller loads the version again with the image downloaded, then its rows).
   */
  public Restore restore(StoreSpec spec, RemoteImage remote, long rows, long expectedChanges) {
    RowImage image;
    RemoteSource source;
    try {
      source = images.open(remote);
      image = RowImage.open(source, spec.keyFields(), spec.valueFields(), cache, true);
      source.opened();
      if (image.rows() != rows || image.hasTombstones()) {
        image.close();
        throw RowImageException.corrupt(remote.id, image.rows() + " records where the snapshot holds " + rows
            + " rows");
      }
    } catch (IOException | RuntimeException e) {
      LOG.warn("spark_state: cannot read the row image {} by range ({}); loading the version again with the image "
          + "downloaded, else its rows", remote.id, e.toString());
      return null;
    }
    source.startSoon(() -> {
      source.background(image::loadPendingFilter);
      source.startFill();
    });
    return restored(spec, image, rows, expectedChanges);
  }

  /**
   * Runs the restore path once on a small image of its own ({@link RestoreWarmUp}), so the executor's first
   * restore does not load and interpret the engine's classes; leaves nothing behind. Answers a checksum of what
   * it read.
   */
  public long warmUp() throws IOException {
    long sum = RestoreWarmUp.run(this);
    warmedUp = true;
    return sum;
  }

  /** Whether {@link #warmUp} ran to its end in this JVM (tests, diagnostics). */
  public boolean warmedUp() {
    return warmedUp;
  }

  private Restore restored(StoreSpec spec, RowImage image, long rows, long expectedChanges) {
    LayeredMap map = new LayeredMap(spec.keyFields(), spec.valueFields(), expectedChanges, spec.order(), this,
        spec.onDamage(), prefixIndex(spec));
    map.setBase(image, rows);
    return new Restore(map, image, spec.order(), lookups);
  }
}
