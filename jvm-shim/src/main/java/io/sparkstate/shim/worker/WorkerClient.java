package io.sparkstate.shim.worker;

import java.io.IOException;
import java.util.ArrayDeque;
import java.util.concurrent.atomic.LongAdder;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.sparkstate.shim.codec.ArrowCodec;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The executor JVM's one Python worker: starts it lazily ({@link WorkerProcess}), keeps a small pool
 * of idle {@link WorkerConnection}s, and replaces the worker when it cannot be reached. A request that
 * fails with an I/O error is retried once, on a new worker if the old one is gone: nothing committed
 * is lost, as commits are durable in storage before they are acknowledged.
 */
public final class WorkerClient {
  private static final Logger LOG = LoggerFactory.getLogger(WorkerClient.class);
  private static final int MAX_IDLE = 8;

  private static WorkerClient instance;

  /** The JVM's client; its worker is stopped when the JVM shuts down. */
  public static synchronized WorkerClient get() {
    if (instance == null) {
      instance = new WorkerClient();
      Runtime.getRuntime().addShutdownHook(new Thread(instance::shutdown, "spark-state-worker-shutdown"));
    }
    return instance;
  }

  private WorkerProcess worker;
  private final ArrayDeque<WorkerConnection> idle = new ArrayDeque<>();
  private boolean shutDown;

  /**
   * Sends one request and reads its reply (see {@link WorkerConnection#exchange}); a reader runs again
   * on a retry, so it must build a fresh result each time. {@code options} start a worker when one is
   * needed; {@code restarts} (may be null) counts the worker restarts this call made.
   */
  <T> T call(ObjectNode header, ArrowCodec.Body body, WorkerConnection.BodyReader<T> reader, Options options,
      LongAdder restarts) {
    IOException first = null;
    while (true) {
      WorkerConnection conn = acquire(options, restarts);
      try {
        T result = conn.exchange(header, body, reader);
        release(conn);
        return result;
      } catch (RuntimeException e) {
        release(conn);   // the worker answered: the connection is in step
        throw e;
      } catch (IOException e) {
        conn.close();
        String op = header.path("op").asText();
        if (first != null) {
          String tail = conn.worker.logTail();
          onConnectionFailure(conn.worker, restarts);
          IllegalStateException ex = new IllegalStateException("spark_state: request '" + op
              + "' to the state worker (pid " + conn.worker.pid + ") failed twice (" + e
              + "). Last lines of the worker's log:\n" + tail, e);
          ex.addSuppressed(first);
          throw ex;
        }
        first = e;
        LOG.warn("spark_state: request '{}' to the worker failed ({}); retrying once", op, e.toString());
        onConnectionFailure(conn.worker, restarts);
      }
    }
  }

  /**
   * Starts the worker now unless one runs (the executor plugin calls this at executor start), and
   * leaves one authenticated connection idle for the first request.
   */
  public void prestart(Options options) {
    long t0 = System.nanoTime();
    release(acquire(options, null));
    LOG.info("spark_state: state worker ready ahead of the first task ({} ms)", (System.nanoTime() - t0) / 1_000_000L);
  }

  /**
   * Waits, at most {@code timeoutMs}, for the running worker's background work (compactions, row images)
   * to finish; no worker running: nothing to wait for. Answers the jobs left undone.
   */
  public long drain(Options options, long timeoutMs) {
    synchronized (this) {
      if (worker == null || shutDown) {
        return 0;
      }
    }
    return StoreClient.drain(this, options, timeoutMs);
  }

  private WorkerConnection acquire(Options options, LongAdder restarts) {
    WorkerProcess w;
    synchronized (this) {
      if (shutDown) {
        throw new IllegalStateException("spark_state: the JVM is shutting down; no state worker");
      }
      if (worker != null) {
        retireIfUnreachable(worker, restarts);
      }
      while (!idle.isEmpty()) {
        WorkerConnection c = idle.pollLast();
        if (c.worker == worker) {
          return c;
        }
        c.close();
      }
      w = current(options);
    }
    try {
      return WorkerConnection.open(w);
    } catch (IOException e) {
      // The socket could not be reached: replace the worker if it is gone, and try once more.
      onConnectionFailure(w, restarts);
      synchronized (this) {
        w = current(options);
      }
      try {
        return WorkerConnection.open(w);
      } catch (IOException e2) {
        throw new IllegalStateException("spark_state: cannot connect to the state worker at "
            + w.socket + " (" + e2 + "). Worker log " + w.log() + ", last lines:\n" + w.logTail(), e2);
      }
    }
  }

  /** The running worker, started if there is none. */
  private synchronized WorkerProcess current(Options options) {
    if (worker == null) {
      worker = WorkerProcess.start(options);
    }
    return worker;
  }

  private synchronized void release(WorkerConnection c) {
    if (!shutDown && c.worker == worker && idle.size() < MAX_IDLE) {
      idle.addLast(c);
    } else {
      c.close();
    }
  }

  /** A connection to {@code w} failed: give a dying process a moment to exit, then replace it if it is gone. */
  private void onConnectionFailure(WorkerProcess w, LongAdder restarts) {
    w.awaitExit(1);
    retireIfUnreachable(w, restarts);
  }

  /**
   * Stops {@code w} and forgets it and its idle connections if it is the current worker and no new
   * connection can reach it ({@link WorkerProcess#unreachable}); the next request starts a new one.
   */
  private synchronized void retireIfUnreachable(WorkerProcess w, LongAdder restarts) {
    String why = worker == w ? w.unreachable() : null;
    if (why == null) {
      return;
    }
    LOG.warn("spark_state: the state worker (pid {}) {}; replacing it. Last lines of its log:\n{}",
        w.pid, why, w.logTail());
    w.stop();
    worker = null;
    if (restarts != null) {
      restarts.increment();
    }
    for (WorkerConnection c : idle) {
      c.close();
    }
    idle.clear();
  }

  private void shutdown() {
    WorkerProcess w;
    synchronized (this) {
      shutDown = true;
      for (WorkerConnection c : idle) {
        c.close();
      }
      idle.clear();
      w = worker;
      worker = null;
    }
    if (w != null) {
      w.stop();
    }
  }
}
