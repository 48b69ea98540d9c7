package io.sparkstate.shim.worker;

import java.io.BufferedInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.RandomAccessFile;
import java.io.UncheckedIOException;
import java.nio.channels.Channels;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Semaphore;

import io.sparkstate.shim.codec.ArrowCodec;
import io.sparkstate.shim.codec.ChunkSink;
import io.sparkstate.shim.memory.MemoryBudget;
import io.sparkstate.shim.memory.Reservation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A batch's changes shipped to the worker while the batch runs (docs/protocol.md, "Streamed
 * commits"): each chunk a {@link io.sparkstate.shim.codec.ChangeLog} cuts is sent in the background, in
 * order, and the worker writes it into the data file the commit will name, so {@code commit()} sends
 * only the tail and waits for the durability point. At most {@link #IN_FLIGHT} chunks are unanswered
 * (their bytes are the budget's "stream" reservation); the task's thread waits beyond that
 * (back-pressure). A chunk leaves the heap once sent: it is also appended to a spool file on local disk
 * (unlinked once open), because a worker restarted mid-batch lost them ({@link WorkerConnection.StreamLost})
 * and the chunks are sent again from there rather than failing the task. Nothing is visible before the
 * commit; an abort drops what the worker holds. Used by one task's thread.
 */
public final class ChangeStream implements ChunkSink {
  private static final Logger LOG = LoggerFactory.getLogger(ChangeStream.class);
  /** Chunks sent and not yet answered before the task's thread waits (a few MiB of slack for the worker). */
  static final int IN_FLIGHT = 8;
  private static final ExecutorService SENDERS = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "spark-state-stream");
    t.setDaemon(true);
    return t;
  });
  private static final SecureRandom IDS = new SecureRandom();

  /** Makes the local file chunks are spooled to (under Spark's local directories). */
  public interface SpoolFiles {
    Path create() throws IOException;
  }

  private final StoreClient client;
  private final long version;
  /** The chunks are the whole state of the version, not changes: the worker writes a snapshot. */
  private final boolean whole;
  private final SpoolFiles spoolFiles;
  private final Reservation inFlight;
  /** Where each chunk starts in the spool, and one more entry: where the next one goes. */
  private final List<Long> offsets = new ArrayList<>(List.of(0L));
  private RandomAccessFile spool;
  private final Semaphore window = new Semaphore(IN_FLIGHT);
  private String id = newId();
  /** The last chunk's send: each send follows the one before it. */
  private CompletableFuture<Void> sending = CompletableFuture.completedFuture(null);
  /** Why a send failed (the rest are skipped; the commit sends them again), or null. */
  private volatile RuntimeException failure;

  /**
   * The stream of {@code version}'s changes of the store {@code client} names, or with {@code whole} of its whole
   * state (a commit that switches file formats), which then leaves the JVM a chunk at a time as changes do.
   */
  public ChangeStream(StoreClient client, long version, SpoolFiles spoolFiles, MemoryBudget budget, boolean whole) {
    this.client = client;
    this.version = version;
    this.whole = whole;
    this.spoolFiles = spoolFiles;
    this.inFlight = budget.reserve("stream", this);
  }

  /** Chunks cut so far. */
  @Override
  public int chunks() {
    return offsets.size() - 1;
  }

  /** Sends {@code chunk} (a complete Arrow stream of changes) after the chunks before it. */
  @Override
  public void send(ArrowCodec.Body chunk) {
    try {
      window.acquire();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("spark_state: interrupted while streaming the changes of version " + version, e);
    }
    int seq = chunks();
    spool(chunk);
    long bytes = chunk.size();
    inFlight.add(bytes);
    String stream = id;
    CompletableFuture<Void> link = sending.thenRunAsync(() -> {
      try {
        if (failure == null) {
          client.stage(version, stream, seq, whole, chunk);
        }
      } catch (Throwable e) {   // whatever it is, the commit sends the chunks again and reports it then
        failure = e instanceof RuntimeException r ? r : new IllegalStateException(e);
      } finally {
        inFlight.add(-bytes);
        window.release();
      }
    }, SENDERS);
    // a send that could not even be scheduled (no thread left) frees its place and fails the stream,
    // and the sends after it still run (they are skipped, and each frees its place)
    sending = link.handle((ok, e) -> {
      if (e != null) {
        failure = new IllegalStateException("spark_state: cannot stream a chunk of version " + version, e);
        inFlight.add(-bytes);
        window.release();
      }
      return null;
    });
  }

  /** Appends a chunk to the spool (created at the first chunk, unlinked at once). */
  private void spool(ArrowCodec.Body chunk) {
    try {
      if (spool == null) {
        Path file = spoolFiles.create();
        try {
          spool = new RandomAccessFile(file.toFile(), "rw");
        } finally {
          Files.deleteIfExists(file);   // read and written through the descriptor; nothing stays on disk
        }
      }
      long at = offsets.get(offsets.size() - 1);
      spool.seek(at);
      OutputStream out = Channels.newOutputStream(spool.getChannel());
      chunk.writeTo(out);
      out.flush();
      offsets.add(at + chunk.size());
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot spool a chunk of the changes of version " + version
          + " to local disk", e);
    }
  }

  /** Chunk {@code seq} again, from the spool. */
  private ArrowCodec.Body spooled(int seq) {
    long at = offsets.get(seq);
    long size = offsets.get(seq + 1) - at;
    try {
      spool.seek(at);
      InputStream in = new BufferedInputStream(Channels.newInputStream(spool.getChannel()), 1 << 16);
      return ArrowCodec.Body.read(in, size);
    } catch (IOException e) {
      throw new UncheckedIOException("spark_state: cannot read a spooled chunk of the changes of version "
          + version + " back from local disk", e);
    }
  }

  /**
   * Commits the version ({@code keys}: its exact key count, -1 unknown): the chunks sent, then {@code tail}. Sends every chunk again, once, from the spool
   * when the worker does not hold them all (a send failed, or the worker was restarted).
   */
  public StoreClient.Committed commit(String baseCommitId, int minVersionsToRetain, boolean repeatedKeys, long keys,
      ArrowCodec.Body tail) {
    sending.join();
    int n = chunks();
    if (n == 0) {
      return client.commit(version, baseCommitId, minVersionsToRetain, whole, repeatedKeys, null, 0, keys, tail);
    }
    try {
      if (failure == null) {
        try {
          return client.commit(version, baseCommitId, minVersionsToRetain, whole, repeatedKeys, id, n, keys, tail);
        } catch (WorkerConnection.StreamLost e) {
          LOG.warn("spark_state: {}; sending the {} chunks of version {} again", e.getMessage(), n, version);
        }
      } else {
        LOG.warn("spark_state: streaming the changes of version {} failed ({}); sending its {} chunks again",
            version, failure.toString(), n);
        dropOnWorker();
      }
      failure = null;
      id = newId();
      for (int seq = 0; seq < n; seq++) {
        client.stage(version, id, seq, whole, spooled(seq));
      }
      return client.commit(version, baseCommitId, minVersionsToRetain, whole, repeatedKeys, id, n, keys, tail);
    } catch (RuntimeException e) {
      dropOnWorker();   // a commit that failed before the worker took the stream leaves nothing there
      throw e;
    } finally {
      release();
    }
  }

  /** Drops what was sent (an aborted or closed log): the worker deletes the file it was writing. Idempotent. */
  @Override
  public void discard() {
    try {
      sending.join();
    } catch (RuntimeException e) {
      LOG.warn("spark_state: streaming the changes of version {} failed: {}", version, e.toString());
    }
    if (chunks() > 0) {
      release();
      dropOnWorker();
    }
  }

  /** Forgets the chunks and closes the spool. */
  private void release() {
    offsets.subList(1, offsets.size()).clear();
    if (spool != null) {
      try {
        spool.close();
      } catch (IOException e) {
        LOG.warn("spark_state: cannot close a spool of streamed changes: {}", e.toString());
      }
      spool = null;
    }
  }

  /** Tells the worker to drop the stream (none there: nothing happens). */
  private void dropOnWorker() {
    try {
      client.abort(version, id);
    } catch (RuntimeException e) {
      LOG.warn("spark_state: cannot drop the streamed changes of version {} ({}); the worker drops them when "
          + "they expire", version, e.toString());
    }
  }

  private static String newId() {
    byte[] b = new byte[12];
    IDS.nextBytes(b);
    return HexFormat.of().formatHex(b);
  }
}
