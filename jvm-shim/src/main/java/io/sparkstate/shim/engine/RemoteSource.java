package io.sparkstate.shim.engine;

import java.io.EOFException;
import java.io.IOException;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicReference;

/**
 * A remote row image's bytes as one store reads them: the tail its load sent (the file's last bytes: filter
 * header, page directory, trailer; before format version 3 the whole index too: the image opens without a
 * request), then pages of the executor's local copy
 * ({@link CachedImage}), fetched through the worker when missing. A failed fetch is a
 * {@link RowImageException} that is not damage ({@link RowImageException#damaged}): the task fails and
 * its retry may restore from the image again.
 */
final class RemoteSource implements BlockSource {
  private final ImageCache cache;
  private final CachedImage image;
  private final RangeReader reader;
  private volatile RemoteImage tail;
  private volatile boolean closed;
  /** {@link #holdBackground}: a lookup's blocks read meanwhile start the background work at the resume. */
  private volatile boolean held;
  private volatile boolean startWhenResumed;
  /** The image's background work ({@link #startSoon}), run once. */
  private final AtomicReference<Runnable> pending = new AtomicReference<>();

  RemoteSource(ImageCache cache, CachedImage image, RemoteImage remote) {
    this.cache = cache;
    this.image = image;
    this.tail = remote;
    RangeReader fetcher = remote.reader;
    this.reader = !remote.fromStorage ? fetcher : (from, to, body) -> {
      long bytes = 0;
      for (int i = 0; i < from.length; i++) {
        bytes += to[i] - from[i];
      }
      cache.counted(bytes);
      fetcher.fetch(from, to, body);
    };
  }

  @Override
  public long size() {
    return image.size;
  }

  @Override
  public byte[] read(long position, int length) throws IOException {
    RemoteImage t = tail;
    byte[] fromTail = t == null ? null : fromTail(t, position, length);
    if (fromTail != null) {
      return fromTail;
    }
    try {
      return image.read(position, length, reader);
    } catch (EOFException e) {
      throw e;
    } catch (IOException e) {
      throw failed(e);
    }
  }

  /** A failed fetch as lookups meet it: the damage it found ({@link RowImageException#lost}), else unfetched. */
  private RowImageException failed(IOException e) {
    RowImageException damage = RowImageException.damageIn(e);
    return damage != null ? damage : RowImageException.unfetched(name(), e);
  }

  /** The bytes from the tail the load sent, when they are in one of its pieces (the image's open reads them). */
  private static byte[] fromTail(RemoteImage t, long position, int length) {
    for (int i = 0; i < t.tail.length; i++) {
      if (t.tailFrom[i] <= position && position + length <= t.tailTo[i]) {
        byte[] out = new byte[length];
        System.arraycopy(t.tail[i], (int) (position - t.tailFrom[i]), out, 0, length);
        return out;
      }
    }
    return null;
  }

  @Override
  public void blocksRead() {
    if (held) {
      startWhenResumed = true;
    } else {
      start();
    }
  }

  @Override
  public void holdBackground() {
    held = true;
  }

  @Override
  public void resumeBackground() {
    held = false;
    if (startWhenResumed) {
      start();
    }
  }

  @Override
  public byte[] reread(long position, int length) throws IOException {
    try {
      return image.reread(position, length, reader);
    } catch (IOException e) {
      throw failed(e);
    }
  }

  @Override
  public void prefetch(long[] from, long[] to) throws IOException {
    try {
      image.prefetch(from, to, reader);
    } catch (IOException e) {
      RowImageException damage = RowImageException.damageIn(e);
      if (damage != null) {
        throw damage;
      }
      throw e;
    }
  }

  @Override
  public boolean remote() {
    return true;
  }

  @Override
  public void background(Runnable job) {
    cache.submit(() -> {
      if (!closed) {
        job.run();
      }
    });
  }

  /** The image is open: the tail's bytes are in its index and filter now. */
  void opened() {
    tail = null;
  }

  /** Starts fetching the rest of the image into the local copy in the background (not once closed). */
  void startFill() {
    if (!closed) {
      cache.fill(image, reader);
    }
  }

  /**
   * Starts {@code work} (it only hands the key filter's load and the fill to the fill threads) after the first
   * lookup has its block ({@link #blocksRead}) or a prefetch its blocks, or {@link ImageCache#FILL_DELAY_MS}
   * from now, whichever comes first: a restore's first lookup (its index page, its block) does not queue behind
   * megabytes of its own image.
   */
  void startSoon(Runnable work) {
    pending.set(work);
    cache.submitLater(this::blocksRead, ImageCache.FILL_DELAY_MS);   // held as a lookup's blocks are
  }

  private void start() {
    Runnable work = pending.get() == null ? null : pending.getAndSet(null);
    if (work != null && !closed) {
      work.run();
    }
  }

  boolean isClosed() {
    return closed;
  }

  /** The copy this source reads (tests). */
  CachedImage image() {
    return image;
  }

  @Override
  public String name() {
    return image.name;
  }

  @Override
  public Path path() {
    return image.file;
  }

  @Override
  public synchronized void close() {
    if (!closed) {
      closed = true;
      tail = null;
      pending.set(null);   // the timer's job no longer holds the image's index and the store's client
      cache.release(image);
    }
  }
}
