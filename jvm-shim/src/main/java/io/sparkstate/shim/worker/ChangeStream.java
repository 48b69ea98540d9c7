package io.sparkstate.shim.worker;

import io.sparkstate.shim.codec.ArrowCodec;
import io.sparkstate.shim.codec.ChunkSink;

import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Semaphore;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A batch's changes shipped to the worker while the batch runs (docs/protocol.md, "Streamed
 * commits"): each chunk a {@link ChangeLog} cuts is sent in the background, in order, and the worker
 * writes it into the data file the commit will name, so {@code commit()} sends only the tail and waits
 * for the durability point. At most {@link #IN_FLIGHT} chunks are unanswered; the task's thread waits
 * beyond that (back-pressure). The chunks are kept until the commit, as the whole log was before
 * streaming: a worker restarted mid-batch lost them ({@link WorkerConnection.StreamLost}), and they
 * are sent again rather than failing the task. Nothing is visible before the commit; an abort drops
 * what the worker holds. Used by one task's thread.
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

  private final StoreClient client;
  private final long version;
  private final List<ArrowCodec.Body> chunks = new ArrayList<>();
  private final Semaphore window = new Semaphore(IN_FLIGHT);
  private String id = newId();
  /** The last chunk's send: each send follows the one before it. */
  private CompletableFuture<Void> sending = CompletableFuture.completedFuture(null);
  /** Why a send failed (the rest are skipped; the commit sends them again), or null. */
  private volatile RuntimeException failure;

  /** The stream of {@code version}'s changes of the store {@code client} names. */
  public ChangeStream(StoreClient client, long version) {
    this.client = client;
    this.version = version;
  }

  /** Chunks cut so far. */
  @Override
  public int chunks() {
    return chunks.size();
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
    int seq = chunks.size();
    chunks.add(chunk);
    String stream = id;
    CompletableFuture<Void> link = sending.thenRunAsync(() -> {
      try {
        if (failure == null) {
          client.stage(version, stream, seq, chunk);
        }
      } catch (Throwable e) {   // whatever it is, the commit sends the chunks again and reports it then
        failure = e instanceof RuntimeException r ? r : new IllegalStateException(e);
      } finally {
        window.release();
      }
    }, SENDERS);
    // a send that could not even be scheduled (no thread left) frees its place and fails the stream,
    // and the sends after it still run (they are skipped, and each frees its place)
    sending = link.handle((ok, e) -> {
      if (e != null) {
        failure = new IllegalStateException("spark_state: cannot stream a chunk of version " + version, e);
        window.release();
      }
      return null;
    });
  }

  /**
   * Commits the version: the chunks sent, then {@code tail}. Sends every chunk again, once, when the
   * worker does not hold them all (a send failed, or the worker was restarted).
   */
  public StoreClient.Committed commit(String baseCommitId, int minVersionsToRetain, boolean repeatedKeys,
      ArrowCodec.Body tail) {
    sending.join();
    if (chunks.isEmpty()) {
      return client.commit(version, baseCommitId, minVersionsToRetain, false, repeatedKeys, null, 0, tail);
    }
    try {
      if (failure == null) {
        try {
          return client.commit(version, baseCommitId, minVersionsToRetain, false, repeatedKeys, id, chunks.size(),
              tail);
        } catch (WorkerConnection.StreamLost e) {
          LOG.warn("spark_state: {}; sending the {} chunks of version {} again", e.getMessage(), chunks.size(),
              version);
        }
      } else {
        LOG.warn("spark_state: streaming the changes of version {} failed ({}); sending its {} chunks again",
            version, failure.toString(), chunks.size());
        dropOnWorker();
      }
      failure = null;
      id = newId();
      for (int seq = 0; seq < chunks.size(); seq++) {
        client.stage(version, id, seq, chunks.get(seq));
      }
      return client.commit(version, baseCommitId, minVersionsToRetain, false, repeatedKeys, id, chunks.size(), tail);
    } catch (RuntimeException e) {
      dropOnWorker();   // a commit that failed before the worker took the stream leaves nothing there
      throw e;
    } finally {
      chunks.clear();
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
    if (!chunks.isEmpty()) {
      chunks.clear();
      dropOnWorker();
    }
  }

  /**
   * Tells the worker to drop the stream (none there: nothing happens). A killed task's thread is still
   * interrupted here, which would close the connection under the request: the flag is cleared for the
   * request and set again after.
   */
  private void dropOnWorker() {
    boolean interrupted = Thread.interrupted();
    try {
      client.abort(version, id);
    } catch (RuntimeException e) {
      LOG.warn("spark_state: cannot drop the streamed changes of version {} ({}); the worker drops them when "
          + "they expire", version, e.toString());
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  private static String newId() {
    byte[] b = new byte[12];
    IDS.nextBytes(b);
    return HexFormat.of().formatHex(b);
  }
}
