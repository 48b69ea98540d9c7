package io.sparkstate.shim.engine;

import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The local copy of one remote row image in the executor's {@link ImageCache}: a sparse file of the
 * image's size under the cache directory, filled in pages of {@link ImageCache#PAGE} bytes as they are
 * fetched (by a lookup that needs them, or by the background fill), and what this JVM knows of each page:
 * missing, being fetched, or present. Only this JVM writes the file and only pages it wrote are read from
 * it, so the page states are the truth about the copy; the copy is never the truth about the state: a page
 * whose bytes fail a block's check is dropped and fetched again, a file that vanished or shrank costs the
 * pages it lost.
 *
 * <p>Lock order: the cache's lock, then an image's (the cache evicts images under its own); a thread
 * holding an image's lock never asks the cache for anything. Fetches run with neither lock held.
 */
final class CachedImage {
  private static final byte MISSING = 0;
  private static final byte FETCHING = 1;
  private static final byte PRESENT = 2;
  /** A read that finds its pages lost again this many times in a row gives up (a file that keeps vanishing). */
  private static final int MAX_ATTEMPTS = 4;
  /**
   * Bytes of the buffer a fetch passes its ranges (8 MiB) through on their way into the file. A buffer of a
   * whole range is a humongous allocation for G1, each setting off a collection: the fill of a 106 MiB image
   * took the JVM 0.9 CPU-seconds with them, 0.6-0.8 without (benchmarks/results/remote-restore/ab-fill-range/).
   * Below half a G1 region (512 KiB at the least), so not humongous; allocated per fetch, as lookups fetch
   * too and a buffer kept per thread would stay with every task thread of the executor.
   */
  private static final int CHUNK_BYTES = 128 << 10;

  final ImageCache cache;
  final String key;
  /** The checkpoint's file, for messages. */
  final String name;
  final long size;
  final Path file;
  private final int page;
  private final int pages;
  /** Guarded by this. */
  private final byte[] state;
  /**
   * Guarded by this: bumped each time the page states are reset (the file vanished while the image was idle, or
   * the image was dropped). A fetch claimed its pages under one generation; under a later one they are not its
   * own any more, so it marks and releases none of them and writes nothing more.
   */
  private int generation;
  /** Guarded by this: pages the background fill looks at first (after the last page a lookup fetched). */
  private int hint;
  /** Guarded by this: fill loops running. */
  private int fillers;
  /** Guarded by itself; null while the image is idle (no store reads it) or dropped. */
  private RandomAccessFile raf;
  /** Guarded by the cache: stores reading the image, bytes of pages it holds or fetches into the file, last use. */
  int users;
  long reserved;
  long lastUse;
  /** Guarded by the cache: evicted (its file deleted); a new use makes a new entry. */
  boolean dropped;
  /** Guarded by the cache: the cache said it had no room for this image's pages (logged once). */
  boolean noRoomLogged;

  CachedImage(ImageCache cache, String key, String name, long size, Path file, int page) {
    this.cache = cache;
    this.key = key;
    this.name = name;
    this.size = size;
    this.file = file;
    this.page = page;
    this.pages = (int) ((size + page - 1) / page);
    this.state = new byte[pages];
  }

  // ------------------------------------------------------------------ the file

  /**
   * Called by the cache with its lock held when a store starts reading the idle image, before {@link #openFile}:
   * a file that vanished or is not the image's size lost its pages. Answers the bytes of pages lost (their room
   * goes back to the cache, whether or not the file opens then).
   */
  synchronized long resetIfLost() throws IOException {
    if (Files.isRegularFile(file) && Files.size(file) == size) {
      return 0;
    }
    long lost = 0;
    generation++;
    for (int p = 0; p < pages; p++) {
      if (state[p] == PRESENT) {
        lost += pageEnd(p) - pageStart(p);
      }
      state[p] = MISSING;
    }
    notifyAll();   // a waiter for a page a fill of the lost file held fetches it itself
    return lost;
  }

  /** Opens the file for a store that starts reading the image (called by the cache with its lock held). */
  void openFile() throws IOException {
    Files.createDirectories(file.getParent());
    RandomAccessFile f = new RandomAccessFile(file.toFile(), "rw");
    try {
      if (f.length() != size) {
        f.setLength(size);   // sparse: no disk taken until pages are written
      }
    } catch (IOException e) {
      f.close();
      throw e;
    }
    synchronized (this) {
      closeFile();
      raf = f;
    }
  }

  /** Closes the file (the image went idle, or is dropped); its pages stay as they are on disk. */
  synchronized void closeFile() {
    if (raf != null) {
      // under the file's lock, as every read and write of it is: closed under a write that has taken the
      // descriptor's number, the number could be reused by a file opened meanwhile and the bytes land there
      try {
        synchronized (raf) {
          raf.close();
        }
      } catch (IOException ignored) {
        // nothing to flush: the copy is a cache
      }
      raf = null;
    }
  }

  /** Drops every page and deletes the file (eviction, with the cache's lock held). */
  synchronized void drop() {
    generation++;
    Arrays.fill(state, MISSING);
    notifyAll();   // the fill that held a page marks and releases nothing now: its waiters must not wait for it
    closeFile();
    try {
      Files.deleteIfExists(file);
    } catch (IOException ignored) {
      // a file that cannot be deleted is overwritten by the next image that takes its name
    }
  }

  private RandomAccessFile file() throws IOException {
    RandomAccessFile f;
    synchronized (this) {
      f = raf;
    }
    if (f == null) {
      throw new IOException("the local copy " + file + " of " + name + " is closed");
    }
    return f;
  }

  // ------------------------------------------------------------------ reads

  int pageOf(long position) {
    return (int) (position / page);
  }

  private long pageStart(int p) {
    return (long) p * page;
  }

  private long pageEnd(int p) {
    return Math.min(size, (long) (p + 1) * page);
  }

  /**
   * Bytes [position, position + length) of the image: from the local copy where its pages are present,
   * else fetched through {@code reader} (and kept in the copy when the cache has room), waiting for pages
   * another thread is fetching.
   */
  byte[] read(long position, int length, RangeReader reader) throws IOException {
    if (position < 0 || length < 0 || position + length > size) {
      throw new EOFException(length + " bytes at " + position + " are past the end of " + name + " (" + size + " bytes)");
    }
    byte[] out = new byte[length];
    if (length == 0 || readPresent(position, out)) {
      return out;
    }
    return readFetching(position, out, reader);
  }

  /**
   * The common case once the copy holds a block's pages: the bytes (on at most two pages, both present) read
   * from the file; false otherwise. Kept apart from {@link #readFetching} so that the compiled lookup path,
   * which inlines this, does not hold the fetching one's page loops: in a profiled 1% batch after a cold
   * restore, their loop checks made C2 throw the compiled {@code RowImage.get} away twice and compile it three
   * times (0.22-0.28 s of the compiler each, on the two cores the fill and the lookups share); once with this.
   */
  private boolean readPresent(long position, byte[] out) throws IOException {
    int p0 = pageOf(position);
    int p1 = pageOf(position + out.length - 1);
    RandomAccessFile f;
    synchronized (this) {
      if (p1 - p0 > 1 || state[p0] != PRESENT || state[p1] != PRESENT) {
        return false;
      }
      f = raf;
    }
    if (f == null) {
      return false;
    }
    try {
      synchronized (f) {
        f.seek(position);
        f.readFully(out);
      }
    } catch (EOFException e) {
      return false;   // the file shrank: the fetching read marks its lost pages and fetches them again
    }
    return true;
  }

  /** {@link #read} of bytes whose pages are not all present: fetched, or waited for while another thread fetches them. */
  private byte[] readFetching(long position, byte[] out, RangeReader reader) throws IOException {
    int length = out.length;
    int p0 = pageOf(position);
    int p1 = pageOf(position + length - 1);
    Map<Integer, byte[]> loose = new HashMap<>();
    for (int attempt = 1; ; attempt++) {
      if (attempt > 1) {
        fetchLoose(p0, p1, reader, loose);
      }
      Claim mine;
      synchronized (this) {
        mine = claim(p0, p1, loose);
        if (!mine.isEmpty()) {
          hint = p1 + 1 < pages ? p1 + 1 : 0;
        }
      }
      if (!mine.isEmpty()) {
        fetch(mine, reader, loose);
      }
      if (awaitPages(p0, p1, loose) && copyOut(position, out, p0, p1, loose)) {
        return out;
      }
      if (attempt >= MAX_ATTEMPTS) {
        throw new IOException("the local copy " + file + " of " + name + " keeps losing pages");
      }
    }
  }

  /** Marks the missing pages of [p0, p1] not already held in {@code loose} as being fetched by the caller. */
  private Claim claim(int p0, int p1, Map<Integer, byte[]> loose) {
    int[] mine = new int[p1 - p0 + 1];
    int n = 0;
    for (int p = p0; p <= p1; p++) {
      if (state[p] == MISSING && !loose.containsKey(p)) {
        state[p] = FETCHING;
        mine[n++] = p;
      }
    }
    return new Claim(Arrays.copyOf(mine, n), generation);
  }

  /**
   * Waits while another thread fetches a page of [p0, p1]; true when every page is present or in
   * {@code loose} (false: a page went missing again, a failed fetch of another thread: try again).
   */
  private synchronized boolean awaitPages(int p0, int p1, Map<Integer, byte[]> loose) throws IOException {
    for (int p = p0; p <= p1; p++) {
      if (loose.containsKey(p)) {
        continue;   // held already: whoever fetches it now is not waited for
      }
      while (state[p] == FETCHING) {
        try {
          wait();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IOException("interrupted while waiting for bytes of " + name, e);
        }
      }
      if (state[p] != PRESENT && !loose.containsKey(p)) {
        return false;
      }
    }
    return true;
  }

  /**
   * Copies [position, position + out.length) into {@code out}: pages in {@code loose} from there, the others
   * from the file, consecutive ones in one read. False when the file lost them (it shrank: the pages past
   * its end are marked missing).
   */
  private boolean copyOut(long position, byte[] out, int p0, int p1, Map<Integer, byte[]> loose) throws IOException {
    long end = position + out.length;
    int p = p0;
    while (p <= p1) {
      byte[] held = loose.get(p);
      if (held != null) {
        long from = Math.max(position, pageStart(p));
        long to = Math.min(end, pageEnd(p));
        System.arraycopy(held, (int) (from - pageStart(p)), out, (int) (from - position), (int) (to - from));
        p++;
        continue;
      }
      int q = p;
      while (q + 1 <= p1 && !loose.containsKey(q + 1)) {
        q++;
      }
      long from = Math.max(position, pageStart(p));
      long to = Math.min(end, pageEnd(q));
      RandomAccessFile f = file();
      try {
        synchronized (f) {
          f.seek(from);
          f.readFully(out, (int) (from - position), (int) (to - from));
        }
      } catch (EOFException e) {
        lostAfter(f);
        return false;
      }
      p = q + 1;
    }
    return true;
  }

  /** The file is shorter than the image (something truncated it): its pages past the end are lost. */
  private void lostAfter(RandomAccessFile f) throws IOException {
    long length;
    synchronized (f) {
      length = f.length();
    }
    long freed = 0;
    synchronized (this) {
      for (int p = pageOf(Math.max(0, length)); p < pages; p++) {
        if (state[p] == PRESENT) {
          state[p] = MISSING;
          freed += pageEnd(p) - pageStart(p);
        }
      }
    }
    cache.unreserve(this, freed);
  }

  /**
   * The bytes [position, position + length) fetched again from the checkpoint, bypassing the copy; the copy's
   * pages under them are dropped (they failed a check), so later reads fetch them again.
   */
  byte[] reread(long position, int length, RangeReader reader) throws IOException {
    byte[][] got = new byte[1][];
    try {
      reader.fetch(new long[] {position}, new long[] {position + length}, in -> {
        got[0] = new byte[length];
        new DataInputStream(in).readFully(got[0]);
      });
    } catch (RuntimeException e) {
      throw new IOException(e.getMessage(), e);
    }
    long freed = 0;
    synchronized (this) {
      for (int p = pageOf(position); p <= pageOf(position + Math.max(length, 1) - 1); p++) {
        if (state[p] == PRESENT) {
          state[p] = MISSING;
          freed += pageEnd(p) - pageStart(p);
        }
      }
    }
    cache.unreserve(this, freed);
    return got[0];
  }

  /**
   * Fetches the missing pages under the ranges [from[i], to[i]) (sorted) into the copy, up to
   * {@link ImageCache#FILL_BYTES} per request, while the cache has room for them.
   */
  void prefetch(long[] from, long[] to, RangeReader reader) throws IOException {
    int max = (int) Math.max(1, ImageCache.FILL_BYTES / page);
    int[] wanted = new int[max];
    int n = 0;
    int last = -1;
    for (int i = 0; i <= from.length; i++) {
      boolean flush = i == from.length;
      if (!flush) {
        for (int p = Math.max(last + 1, pageOf(from[i])); p <= pageOf(Math.max(from[i], to[i] - 1)) && p < pages; p++) {
          wanted[n++] = p;
          last = p;
          if (n == max) {
            if (!prefetchPages(wanted, n, reader)) {
              return;
            }
            n = 0;
          }
        }
      } else if (n > 0) {
        prefetchPages(wanted, n, reader);
      }
    }
  }

  /** Claims the missing ones of these pages and fetches them into the copy; false when the cache had no room. */
  private boolean prefetchPages(int[] wanted, int n, RangeReader reader) throws IOException {
    int[] pages = new int[n];
    int m = 0;
    Claim mine;
    synchronized (this) {
      for (int i = 0; i < n; i++) {
        if (state[wanted[i]] == MISSING) {
          state[wanted[i]] = FETCHING;
          pages[m++] = wanted[i];
        }
      }
      mine = new Claim(Arrays.copyOf(pages, m), generation);
    }
    if (mine.isEmpty()) {
      return true;
    }
    if (!fetchCached(mine, reader)) {
      release(mine);
      return false;
    }
    return true;
  }

  // ------------------------------------------------------------------ fetching

  /**
   * Fetches pages the caller claimed: into the file when the cache has room (present), else into
   * {@code loose} (missing again for everyone else). On failure every claimed page is missing again.
   */
  private void fetch(Claim mine, RangeReader reader, Map<Integer, byte[]> loose) throws IOException {
    if (fetchCached(mine, reader)) {
      return;
    }
    try {
      fetchInto(mine.pages, reader, loose);
    } finally {
      release(mine);
    }
  }

  /**
   * The pages of [p0, p1] neither present nor held in {@code loose}, fetched into it without a claim: a read
   * that lost its pages once (another thread's fetch kept them nowhere, the copy shrank, the image was
   * dropped) does not wait behind another claim, so only a copy that keeps losing the present pages fails it.
   */
  private void fetchLoose(int p0, int p1, RangeReader reader, Map<Integer, byte[]> loose) throws IOException {
    int[] wanted = new int[p1 - p0 + 1];
    int n = 0;
    synchronized (this) {
      for (int p = p0; p <= p1; p++) {
        if (state[p] != PRESENT && !loose.containsKey(p)) {
          wanted[n++] = p;
        }
      }
    }
    if (n > 0) {
      fetchInto(Arrays.copyOf(wanted, n), reader, loose);
    }
  }

  /** Fetches these pages (sorted) from the checkpoint into {@code loose}, keeping none in the copy. */
  private void fetchInto(int[] sortedPages, RangeReader reader, Map<Integer, byte[]> loose) throws IOException {
    long[][] ranges = ranges(sortedPages, Integer.MAX_VALUE);
    try {
      reader.fetch(ranges[0], ranges[1], in -> {
        DataInputStream data = new DataInputStream(in);
        for (int i = 0; i < ranges[0].length; i++) {
          for (int p = pageOf(ranges[0][i]); p <= pageOf(ranges[1][i] - 1); p++) {
            byte[] bytes = new byte[(int) (pageEnd(p) - pageStart(p))];
            data.readFully(bytes);
            loose.put(p, bytes);
          }
        }
      });
    } catch (RuntimeException e) {
      throw new IOException(e.getMessage(), e);
    }
  }

  /**
   * Fetches claimed pages into the file if the cache has room for them: true when they are present (or
   * missing again after a failed write to local disk, or after the file was found lost meanwhile: the caller
   * reads them another way), false when there was no room (the pages stay claimed). A failed fetch releases
   * them and throws.
   */
  private boolean fetchCached(Claim mine, RangeReader reader) throws IOException {
    long bytes = 0;
    for (int p : mine.pages) {
      bytes += pageEnd(p) - pageStart(p);
    }
    if (!cache.reserve(this, bytes)) {
      return false;
    }
    long[][] ranges = ranges(mine.pages, ImageCache.RANGE_BYTES);
    long[] kept = new long[ranges[0].length];   // leading bytes of each range written and marked present
    // false once a write failed or the page states were reset: the claim is released then, at once, so that
    // lookups waiting for its pages fetch them themselves instead of waiting for the rest of this request
    boolean[] writing = {true};
    try {
      reader.fetch(ranges[0], ranges[1], in -> {
        DataInputStream data = new DataInputStream(in);
        byte[] chunk = new byte[CHUNK_BYTES];
        for (int i = 0; i < ranges[0].length; i++) {
          long from = ranges[0][i];
          long to = ranges[1][i];
          for (long at = from; at < to; ) {
            int n = (int) Math.min(chunk.length, to - at);
            data.readFully(chunk, 0, n);
            if (writing[0] && !write(at, chunk, n, mine.generation)) {
              writing[0] = false;
              release(mine);
            }
            at += n;
            // whole pages are present as they arrive (a range starts on a page), so a lookup waits for its
            // page, not for the rest of the range
            long whole = at == to ? to : from + (at - from) / page * page;
            if (writing[0] && whole > from + kept[i]) {
              if (present(from + kept[i], whole, mine.generation)) {
                kept[i] = whole - from;
              } else {
                writing[0] = false;   // the pages are not this fetch's any more: nothing to release
              }
            }
          }
        }
      });
    } catch (IOException | RuntimeException | Error e) {   // an Error too: pages left claimed would hang waiters
      if (writing[0]) {
        release(mine);
      }
      cache.unreserve(this, unkept(ranges, kept));
      if (e instanceof IOException) {
        throw (IOException) e;
      }
      if (e instanceof Error) {
        throw (Error) e;
      }
      throw new IOException(e.getMessage(), e);
    }
    long lost = unkept(ranges, kept);
    if (lost > 0) {
      if (writing[0]) {
        release(mine);
      }
      cache.unreserve(this, lost);
    }
    return true;
  }

  private static long unkept(long[][] ranges, long[] kept) {
    long n = 0;
    for (int i = 0; i < kept.length; i++) {
      n += ranges[1][i] - ranges[0][i] - kept[i];
    }
    return n;
  }

  /**
   * Writes fetched bytes into the file; false when the file was closed meanwhile (the last store reading the
   * image let it go: a fill that was under way), the page states were reset since the pages were claimed (a
   * later file), or local disk refuses the bytes (logged once by the cache).
   */
  private boolean write(long position, byte[] bytes, int n, int claimed) {
    RandomAccessFile f;
    synchronized (this) {
      f = generation == claimed ? raf : null;
    }
    if (f == null) {
      return false;
    }
    try {
      synchronized (f) {
        f.seek(position);
        f.write(bytes, 0, n);
      }
      return true;
    } catch (IOException e) {
      boolean closed;
      synchronized (this) {
        closed = raf != f;
      }
      if (!closed) {
        cache.writeFailed(file, e);
      }
      return false;
    }
  }

  /**
   * Pages fully inside [from, to) are present now (their bytes are in the file); false, marking none, when the
   * page states were reset since they were claimed (the bytes may have gone to a file that is gone).
   */
  private synchronized boolean present(long from, long to, int claimed) {
    if (generation != claimed) {
      return false;
    }
    for (int p = pageOf(from); p <= pageOf(to - 1); p++) {
      if (state[p] == FETCHING) {
        state[p] = PRESENT;
      }
    }
    notifyAll();
    return true;
  }

  /**
   * Claimed pages that are not present go back to missing (a failed or uncached fetch); none after a reset:
   * another thread may have claimed them since. Called once per claim.
   */
  private synchronized void release(Claim mine) {
    if (generation == mine.generation) {
      for (int p : mine.pages) {
        if (state[p] == FETCHING) {
          state[p] = MISSING;
        }
      }
    }
    notifyAll();
  }

  /** Consecutive pages as ranges [from, to) of at most {@code maxBytes} (whole pages, at least one each). */
  private long[][] ranges(int[] sortedPages, long maxBytes) {
    List<long[]> out = new ArrayList<>();
    int i = 0;
    while (i < sortedPages.length) {
      int j = i;
      while (j + 1 < sortedPages.length && sortedPages[j + 1] == sortedPages[j] + 1
          && pageEnd(sortedPages[j + 1]) - pageStart(sortedPages[i]) <= maxBytes) {
        j++;
      }
      out.add(new long[] {pageStart(sortedPages[i]), pageEnd(sortedPages[j])});
      i = j + 1;
    }
    long[][] r = new long[2][out.size()];
    for (int k = 0; k < out.size(); k++) {
      r[0][k] = out.get(k)[0];
      r[1][k] = out.get(k)[1];
    }
    return r;
  }

  // ------------------------------------------------------------------ the background fill

  /** A fill loop may start (at most {@link ImageCache#FILL_STREAMS} per image). */
  synchronized boolean startFiller() {
    if (fillers >= ImageCache.FILL_STREAMS || presentCount() == pages) {
      return false;
    }
    fillers++;
    return true;
  }

  synchronized void fillerDone() {
    fillers--;
  }

  /**
   * One step of the background fill: up to {@link ImageCache#FILL_BYTES} of missing pages from the hint on, in
   * ranges of at most {@link ImageCache#RANGE_BYTES}, fetched in one request into the file. False when there is
   * nothing left to fetch or no room for it.
   */
  boolean fillStep(RangeReader reader) throws IOException {
    Claim mine;
    synchronized (this) {
      mine = claimFrom(hint, (int) Math.max(1, ImageCache.FILL_BYTES / page));
      if (!mine.isEmpty()) {
        int next = mine.pages[mine.pages.length - 1] + 1;
        hint = next < pages ? next : 0;
      }
    }
    if (mine.isEmpty()) {
      return false;
    }
    if (!fetchCached(mine, reader)) {
      release(mine);
      return false;
    }
    return true;
  }

  /**
   * Claims up to {@code max} missing pages in file order from {@code from} on, wrapping around at the end (runs
   * of them become the ranges of one request).
   */
  private Claim claimFrom(int from, int max) {
    int[] mine = new int[Math.min(max, pages)];
    int n = 0;
    for (int k = 0; k < pages && n < mine.length; k++) {
      int p = (from + k) % pages;
      if (state[p] == MISSING) {
        state[p] = FETCHING;
        mine[n++] = p;
      }
    }
    return new Claim(Arrays.copyOf(mine, n), generation);
  }

  private int presentCount() {
    int n = 0;
    for (byte b : state) {
      n += b == PRESENT ? 1 : 0;
    }
    return n;
  }

  /** Pages present, and pages in all (tests, metrics). */
  synchronized int[] pageCounts() {
    return new int[] {presentCount(), pages};
  }

  /** Pages a thread claimed for fetching (sorted), with the generation of the page states it claimed them in. */
  private static final class Claim {
    final int[] pages;
    final int generation;

    Claim(int[] pages, int generation) {
      this.pages = pages;
      this.generation = generation;
    }

    boolean isEmpty() {
      return pages.length == 0;
    }
  }
}
