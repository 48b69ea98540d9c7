package io.sparkstate.shim.engine;

import java.io.IOException;
import java.io.InputStream;
import java.lang.reflect.Field;
import java.nio.file.Files;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Races of the executor's cache of remote images, played in a fixed order with a reader that holds its requests
 * where the test says (tests/jvm/test_remote_images.py), with {@code -Dspark_state.imageFillStreams=0}; prints
 * "OK ..." or "BAD why".
 * <ul>
 *   <li>{@code lost} ({@code -Dspark_state.imageCachePage=262144}: a page is two of the fill's 128 KiB writes): a
 *       background fill still under way when its image goes idle, the copy's file vanishes, and a store opens the
 *       image again; a lookup then claims a page the fill had half written into the vanished file.
 *   <li>{@code dropped} ({@code -Dspark_state.imageCachePage=131072}: a page is one write): a lookup waits for a
 *       page a fill fetches; the fill has written it when its store closes and another image's room evicts the
 *       image; the lookup must not wait forever for a fill that can no longer mark the page.
 * </ul>
 */
public class CachedImageRaceProbe {
  /** Serves an in-memory image; a request may be held once after a given number of its bytes. */
  static final class HeldReader implements RangeReader {
    final byte[] image;
    private final ArrayDeque<Hold> holds = new ArrayDeque<>();

    HeldReader(byte[] image) {
      this.image = image;
    }

    /** The next request stops after {@code bytes} of its bytes until {@link Hold#resume}. */
    synchronized Hold holdNext(long bytes) {
      Hold h = new Hold(bytes);
      holds.add(h);
      return h;
    }

    @Override
    public void fetch(long[] from, long[] to, Body body) throws IOException {
      Hold hold;
      synchronized (this) {
        hold = holds.poll();
      }
      int n = 0;
      for (int i = 0; i < from.length; i++) {
        n += (int) (to[i] - from[i]);
      }
      byte[] bytes = new byte[n];
      int at = 0;
      for (int i = 0; i < from.length; i++) {
        System.arraycopy(image, (int) from[i], bytes, at, (int) (to[i] - from[i]));
        at += (int) (to[i] - from[i]);
      }
      body.read(new HeldStream(bytes, hold));
    }
  }

  static final class Hold {
    final long after;
    final CountDownLatch reached = new CountDownLatch(1);
    final CountDownLatch resumed = new CountDownLatch(1);

    Hold(long after) {
      this.after = after;
    }

    void awaitReached() throws InterruptedException {
      if (!reached.await(30, TimeUnit.SECONDS)) {
        throw new IllegalStateException("a held request never reached its hold");
      }
    }

    void resume() {
      resumed.countDown();
    }
  }

  static final class HeldStream extends InputStream {
    private final byte[] bytes;
    private final Hold hold;
    private int at;

    HeldStream(byte[] bytes, Hold hold) {
      this.bytes = bytes;
      this.hold = hold;
    }

    @Override
    public int read() throws IOException {
      byte[] one = new byte[1];
      return read(one, 0, 1) < 0 ? -1 : one[0] & 0xff;
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
      if (hold != null && at == hold.after && hold.resumed.getCount() > 0) {
        hold.reached.countDown();
        try {
          hold.resumed.await();
        } catch (InterruptedException e) {
          throw new IOException(e);
        }
      }
      if (at >= bytes.length) {
        return -1;
      }
      long limit = hold != null && at < hold.after ? hold.after : bytes.length;
      int n = (int) Math.min(len, limit - at);
      System.arraycopy(bytes, at, b, off, n);
      at += n;
      return n;
    }
  }

  /** A read on a thread of its own, for reads that may wait on another thread's fetch. */
  static final class Reader extends Thread {
    final RemoteSource source;
    final long position;
    final int length;
    volatile byte[] got;
    volatile Throwable failed;

    Reader(RemoteSource source, long position, int length) {
      this.source = source;
      this.position = position;
      this.length = length;
      setDaemon(true);
      start();
    }

    @Override
    public void run() {
      try {
        got = source.read(position, length);
      } catch (Throwable e) {
        failed = e;
      }
    }
  }

  /** Null when the cache charges the copy exactly its pages present, else why not. */
  static String charged(ImageCache cache, CachedImage copy, int page) {
    int[] counts = copy.pageCounts();
    long reserved;
    synchronized (cache) {
      reserved = copy.reserved;
    }
    if (reserved != (long) counts[0] * page || cache.usedBytes() != reserved) {
      return "BAD the cache charges " + reserved + " bytes (" + cache.usedBytes() + " in all) for " + counts[0]
          + " pages present of " + page + " bytes (the fill's reservation outlived its pages)";
    }
    return null;
  }

  public static void main(String[] args) throws Exception {
    String scenario = args.length > 0 ? args[0] : "lost";
    System.out.println(scenario.equals("dropped") ? dropped() : scenario.equals("idle") ? idle() : lost());
    System.exit(0);
  }

  /**
   * A bound of 4 pages: an idle image holds 1, an open one 3. Room for 2 more pages of the open one cannot be
   * made by evicting the idle one, so it must stay (a later restore of it reads it locally); room for 1 can.
   */
  static String idle() throws Exception {
    int page = ImageCache.PAGE;
    byte[] image = new byte[4 * page];
    HeldReader reader = new HeldReader(image);
    ImageCache cache = new ImageCache();
    cache.setCapacity(4L * page);
    RemoteSource a = cache.open(new RemoteImage("a.img", "c0", image.length, new long[0], new long[0],
        new byte[0][], reader));
    CachedImage idle = a.image();
    if (!cache.reserve(idle, page)) {
      return "BAD no room for the first page";
    }
    a.close();
    RemoteSource b = cache.open(new RemoteImage("b.img", "c1", image.length, new long[0], new long[0],
        new byte[0][], reader));
    if (!cache.reserve(b.image(), 3L * page)) {
      return "BAD no room for 3 pages beside the idle one";
    }
    boolean tooMuch = cache.reserve(b.image(), 2L * page);
    String after;
    synchronized (cache) {
      after = tooMuch + " " + idle.dropped + " " + idle.reserved / page;
    }
    boolean fits = cache.reserve(b.image(), page);
    synchronized (cache) {
      return "OK " + after + " " + fits + " " + idle.dropped + " " + cache.usedBytes() / page;
    }
  }

  static String lost() throws Exception {
    int page = ImageCache.PAGE;
    if (page != 256 << 10 || ImageCache.FILL_STREAMS != 0) {
      return "BAD run with -Dspark_state.imageCachePage=262144 -Dspark_state.imageFillStreams=0";
    }
    byte[] image = new byte[4 * page];
    new Random(38).nextBytes(image);
    HeldReader reader = new HeldReader(image);
    ImageCache cache = new ImageCache();
    cache.setCapacity(64L << 20);
    RemoteImage remote = new RemoteImage("race.img", "c0", image.length, new long[0], new long[0], new byte[0][],
        reader);

    // a fill step of the whole image, held after its first write: half of page 0 is in the first file
    RemoteSource first = cache.open(remote);
    CachedImage copy = first.image();
    Hold fillHold = reader.holdNext(128 << 10);
    Thread fill = new Thread(() -> {
      try {
        copy.fillStep(reader);
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
    });
    fill.setDaemon(true);
    fill.start();
    fillHold.awaitReached();

    // the image goes idle, its file vanishes, a store opens it again: a new file, every page missing
    first.close();
    Files.delete(copy.file);
    RemoteSource second = cache.open(remote);
    if (second.image() != copy) {
      return "BAD the reopened image is a new entry of the cache, not the one the fill writes";
    }

    // a lookup claims page 0 and is held before its bytes arrive; then the fill goes on and ends
    Hold lookupHold = reader.holdNext(0);
    Reader lookup = new Reader(second, 100, 16);
    lookupHold.awaitReached();
    fillHold.resume();
    fill.join(30_000);

    // another lookup of page 0 waits for the first one; it must not read the half the fill wrote elsewhere
    Reader early = new Reader(second, 0, 64);
    early.join(500);
    if (early.got != null && !Arrays.equals(early.got, Arrays.copyOfRange(image, 0, 64))) {
      return "BAD page 0 was read as present before its bytes were in the copy: the fill claimed it in the "
          + "vanished file";
    }
    lookupHold.resume();
    lookup.join(30_000);
    early.join(30_000);
    for (Reader r : new Reader[] {lookup, early}) {
      if (r.failed != null) {
        return "BAD a lookup failed: " + r.failed;
      }
      if (!Arrays.equals(r.got, Arrays.copyOfRange(image, (int) r.position, (int) r.position + r.length))) {
        return "BAD a lookup at " + r.position + " read wrong bytes";
      }
    }
    String charged = charged(cache, copy, page);
    if (charged != null) {
      return charged;
    }
    byte[] whole = second.read(0, image.length);
    if (!Arrays.equals(whole, image)) {
      return "BAD the image reads wrong after the race";
    }
    charged = charged(cache, copy, page);
    if (charged != null) {
      return charged;
    }
    int[] counts = copy.pageCounts();
    second.close();
    return "OK " + counts[0] + " " + cache.usedBytes();
  }

  /** Whether {@code t} waits for a lock in {@code method}. */
  static boolean blockedIn(Thread t, String method) {
    return t.getState() == Thread.State.BLOCKED
        && t.getStackTrace().length > 0 && t.getStackTrace()[0].getMethodName().equals(method);
  }

  static void until(java.util.function.BooleanSupplier c, String what) throws InterruptedException {
    long end = System.nanoTime() + 30_000_000_000L;
    while (!c.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new IllegalStateException("never: " + what);
      }
      Thread.sleep(5);
    }
  }

  static String dropped() throws Exception {
    int page = ImageCache.PAGE;
    if (page != 128 << 10 || ImageCache.FILL_STREAMS != 0) {
      return "BAD run with -Dspark_state.imageCachePage=131072 -Dspark_state.imageFillStreams=0";
    }
    byte[] image = new byte[4 * page];
    new Random(7).nextBytes(image);
    HeldReader reader = new HeldReader(image);
    ImageCache cache = new ImageCache();
    cache.setCapacity(4L * page);
    RemoteImage remote = new RemoteImage("a.img", "c0", image.length, new long[0], new long[0], new byte[0][],
        reader);
    RemoteImage remote2 = new RemoteImage("b.img", "c1", image.length, new long[0], new long[0], new byte[0][],
        reader);
    RemoteSource first = cache.open(remote);
    RemoteSource other = cache.open(remote2);
    CachedImage copy = first.image();
    CachedImage copy2 = other.image();

    Hold fillHold = reader.holdNext(0);
    Thread fill = new Thread(() -> {
      try {
        copy.fillStep(reader);
      } catch (Exception e) {
        e.printStackTrace();
      }
    }, "fill");
    fill.setDaemon(true);
    fill.start();
    fillHold.awaitReached();

    // a read of the open store waits for page 1, which the fill fetches
    Reader waiter = new Reader(first, page + 100, 16);
    until(() -> waiter.getState() == Thread.State.WAITING, "the read waits");

    // the fill's write of page 0 is held on the file's lock until the evictor holds the cache's and the image's
    Field rafField = CachedImage.class.getDeclaredField("raf");
    rafField.setAccessible(true);
    Object raf = rafField.get(copy);
    CountDownLatch t2Holds = new CountDownLatch(1);
    CountDownLatch go = new CountDownLatch(1);
    Thread t2 = new Thread(() -> {
      synchronized (cache) {
        synchronized (copy) {
          t2Holds.countDown();
          try {
            go.await();
          } catch (InterruptedException e) {
            return;
          }
          first.close();                      // the store goes: image idle
          cache.reserve(copy2, page);         // another image needs room: the idle one is evicted (drop)
        }
      }
    }, "evictor");
    t2.setDaemon(true);
    synchronized (raf) {
      fillHold.resume();
      until(() -> blockedIn(fill, "write"), "fill blocked in write on the file");
      t2.start();
      t2Holds.await();
    }
    // the fill writes page 0 into the (still open) file, then waits for the image's lock to mark it present
    until(() -> blockedIn(fill, "present"), "fill blocked in present");
    go.countDown();
    t2.join(30_000);
    fill.join(30_000);
    if (fill.isAlive()) {
      return "BAD the fill did not end";
    }
    String acct;
    synchronized (cache) {
      acct = "reserved " + copy.reserved + " " + copy2.reserved + " used " + cache.usedBytes() + " dropped "
          + copy.dropped;
    }
    waiter.join(5_000);
    if (waiter.isAlive()) {
      return "BAD the read waiting for page 1 hangs (state " + waiter.getState() + "); " + acct;
    }
    if (waiter.failed != null) {
      return "BAD the read failed: " + waiter.failed + "; " + acct;
    }
    if (!Arrays.equals(waiter.got, Arrays.copyOfRange(image, page + 100, page + 116))) {
      return "BAD the read got wrong bytes; " + acct;
    }
    return "OK " + acct;
  }
}
