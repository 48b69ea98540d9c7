package io.sparkstate.shim;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.File;
import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.SecureRandom;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The executor JVM's one Python worker (docs/protocol.md): starts it lazily, keeps a small pool
 * of authenticated Unix-socket connections, frames requests and maps error replies to exceptions.
 * If a request fails with an I/O error the worker is restarted (when it died) and the request is
 * retried once.
 */
final class WorkerClient {
  static final int PROTOCOL = 1;
  static final String PYTHON_OPTION = SparkStateProvider.OPTION_PREFIX + "python";
  private static final Logger LOG = LoggerFactory.getLogger(WorkerClient.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final long READY_TIMEOUT_SEC = 60;
  private static final int MAX_IDLE = 8;
  private static final int LOG_TAIL_LINES = 30;

  private static WorkerClient instance;

  static synchronized WorkerClient get() {
    if (instance == null) {
      instance = new WorkerClient();
      Thread hook = new Thread(instance::shutdown, "spark-state-worker-shutdown");
      Runtime.getRuntime().addShutdownHook(hook);
    }
    return instance;
  }

  /** Reads a reply body (an Arrow stream) while the connection is held. */
  interface BodyReader<T> {
    T read(JsonNode header, InputStream body) throws IOException;
  }

  private Worker worker;
  private final ArrayDeque<Connection> idle = new ArrayDeque<>();
  private final AtomicLong restarts = new AtomicLong();
  private boolean shutDown;

  /** Restarts since the JVM started. */
  long restarts() {
    return restarts.get();
  }

  /** Restarts performed by requests of the calling thread (a task's store reports its own). */
  static long threadRestarts() {
    return THREAD_RESTARTS.get()[0];
  }

  private static final ThreadLocal<long[]> THREAD_RESTARTS = ThreadLocal.withInitial(() -> new long[1]);

  private void countRestart() {
    restarts.incrementAndGet();
    THREAD_RESTARTS.get()[0]++;
  }

  static ObjectNode header(String op) {
    ObjectNode h = JSON.createObjectNode();
    h.put("op", op);
    return h;
  }

  static ObjectNode optionsNode(Map<String, String> options) {
    ObjectNode o = JSON.createObjectNode();
    for (Map.Entry<String, String> e : options.entrySet()) {
      o.put(e.getKey(), e.getValue());
    }
    return o;
  }

  /** Sends one request; returns the reply header (ok). Bodies of replies are skipped. */
  JsonNode call(ObjectNode header, ArrowCodec.Body body, Map<String, String> options) {
    return call(header, body, options, null);
  }

  /**
   * Sends one request and reads its reply. With a reader, the reply body is handed to it;
   * on a retry the reader runs again from scratch, so it must build a fresh result each time.
   */
  <T> T call(ObjectNode header, ArrowCodec.Body body, Map<String, String> options, BodyReader<T> reader) {
    String op = header.path("op").asText();
    IOException first = null;
    for (int attempt = 0; attempt < 2; attempt++) {
      Connection conn = acquire(options);
      try {
        conn.send(header, body);
        Reply reply = conn.receive();
        try {
          if (!reply.header.path("ok").asBoolean(false)) {
            throw workerError(reply.header);
          }
          @SuppressWarnings("unchecked")
          T result = reader == null ? (T) reply.header : reader.read(reply.header, reply.body);
          reply.body.skipRest();
          release(conn);
          return result;
        } catch (RuntimeException e) {
          reply.body.skipRest();
          release(conn);
          throw e;
        }
      } catch (IOException e) {
        conn.close();
        if (first == null) {
          first = e;
          LOG.warn("spark_state: request '{}' to the worker failed ({}); retrying once", op, e.toString());
          onConnectionFailure(conn.worker);
        } else {
          String tail = conn.worker.logTail();
          onConnectionFailure(conn.worker);
          IllegalStateException ex = new IllegalStateException(
              "spark_state: request '" + op + "' to the state worker (pid " + conn.worker.pid
                  + ") failed twice (" + e + "). Last lines of the worker's log:\n" + tail, e);
          ex.addSuppressed(first);
          throw ex;
        }
      }
    }
    throw new AssertionError("unreachable");
  }

  private static RuntimeException workerError(JsonNode reply) {
    String kind = reply.path("kind").asText("Error");
    String error = reply.path("error").asText("(no message)");
    String msg = "spark_state: " + error;
    if ("OptionError".equals(kind)) {
      return new IllegalArgumentException(msg);
    }
    return new IllegalStateException(msg);
  }

  /**
   * Starts the worker now unless one runs (the executor plugin calls this at executor start), and
   * leaves one authenticated connection idle for the first request.
   */
  void prestart(Map<String, String> options) {
    long t0 = System.nanoTime();
    release(acquire(options));
    LOG.info("spark_state: state worker ready ahead of the first task ({} ms)", (System.nanoTime() - t0) / 1_000_000L);
  }

  // ---------------------------------------------------------------- connections

  private Connection acquire(Map<String, String> options) {
    Worker w;
    synchronized (this) {
      if (shutDown) {
        throw new IllegalStateException("spark_state: the JVM is shutting down; no state worker");
      }
      if (worker != null && worker.process.isAlive() && !Files.exists(worker.socket)) {
        // Open connections outlive a deleted socket file, but no new one can reach this worker: replace it
        // now rather than when some later task needs a second connection.
        LOG.warn("spark_state: the state worker (pid {}) is alive but its socket {} is gone (deleted by a "
            + "temp-file cleaner?); replacing it", worker.pid, worker.socket);
        retire(worker);
      }
      while (!idle.isEmpty()) {
        Connection c = idle.pollLast();
        if (c.worker == worker && worker != null && worker.process.isAlive()) {
          return c;
        }
        c.close();
      }
      if (worker == null || !worker.process.isAlive()) {
        if (worker != null) {
          LOG.warn("spark_state: the state worker (pid {}) has exited; starting a new one. Last lines of its log:\n{}",
              worker.pid, worker.logTail());
          worker.kill();
          deleteTree(worker.dir.toFile());
          countRestart();
        }
        worker = null;
        worker = Worker.start(options);
      }
      w = worker;
    }
    try {
      return Connection.open(w);
    } catch (IOException e) {
      // The socket could not be reached: treat as a dead worker and try a fresh one once.
      onConnectionFailure(w);
      synchronized (this) {
        if (worker == null) {
          worker = Worker.start(options);
        }
        w = worker;
      }
      try {
        return Connection.open(w);
      } catch (IOException e2) {
        throw new IllegalStateException("spark_state: cannot connect to the state worker at "
            + w.socket + " (" + e2 + "). Worker log " + w.log() + ", last lines:\n" + w.logTail(), e2);
      }
    }
  }

  private synchronized void release(Connection c) {
    if (!shutDown && c.worker == worker && idle.size() < MAX_IDLE) {
      idle.addLast(c);
    } else {
      c.close();
    }
  }

  /**
   * A connection to {@code w} failed: if the process is gone, or alive but unreachable because its
   * socket file was deleted (a /tmp cleaner), forget it so the next call starts a new one.
   */
  private void onConnectionFailure(Worker w) {
    boolean exited;
    try {
      exited = w.process.waitFor(1, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      exited = !w.process.isAlive();
    }
    boolean orphaned = !exited && !Files.exists(w.socket);
    synchronized (this) {
      if (worker == w && (exited || orphaned)) {
        if (orphaned) {
          LOG.warn("spark_state: the state worker (pid {}) is alive but its socket {} is gone (deleted by a "
              + "temp-file cleaner?); replacing it", w.pid, w.socket);
        } else {
          LOG.warn("spark_state: the state worker (pid {}) died with exit code {}; a new one will be started. "
              + "Last lines of its log:\n{}", w.pid, w.process.exitValue(), w.logTail());
        }
        retire(w);
      }
    }
  }

  /** Stops the current worker {@code w} and forgets it and its idle connections; the next call starts anew. */
  private synchronized void retire(Worker w) {
    w.kill();
    deleteTree(w.dir.toFile());
    worker = null;
    countRestart();
    for (Connection c : idle) {
      c.close();
    }
    idle.clear();
  }

  private void shutdown() {
    Worker w;
    synchronized (this) {
      shutDown = true;
      for (Connection c : idle) {
        c.close();
      }
      idle.clear();
      w = worker;
      worker = null;
    }
    if (w != null) {
      w.kill();
      deleteTree(w.dir.toFile());
    }
  }

  // ---------------------------------------------------------------- the process

  static final class Worker {
    final Process process;
    final Path dir;
    final Path socket;
    final String secret;
    final String python;
    final long pid;
    private final OutputStream stdin;

    private Worker(Process process, Path dir, String secret, String python, long pid, OutputStream stdin) {
      this.process = process;
      this.dir = dir;
      this.socket = dir.resolve("worker.sock");
      this.secret = secret;
      this.python = python;
      this.pid = pid;
      this.stdin = stdin;
    }

    Path log() {
      return dir.resolve("worker.log");
    }

    String logTail() {
      return tail(log());
    }

    /** Closes stdin (the worker exits on EOF), then makes sure the process is gone. */
    void kill() {
      try {
        stdin.close();
      } catch (IOException ignored) {
        // already closed
      }
      try {
        if (!process.waitFor(3, TimeUnit.SECONDS)) {
          process.destroy();
          if (!process.waitFor(2, TimeUnit.SECONDS)) {
            process.destroyForcibly();
          }
        }
      } catch (InterruptedException e) {
        process.destroyForcibly();
        Thread.currentThread().interrupt();
      }
      try {
        Files.deleteIfExists(socket);
      } catch (IOException ignored) {
        // best effort
      }
    }

    static Worker start(Map<String, String> options) {
      String[] chosen = choosePython(options);
      String python = chosen[0];
      String source = chosen[1];
      Path dir;
      try {
        dir = privateDir();
      } catch (IOException e) {
        throw new IllegalStateException("spark_state: cannot create a private directory for the state worker: " + e, e);
      }
      Path log = dir.resolve("worker.log");
      byte[] raw = new byte[32];
      new SecureRandom().nextBytes(raw);
      StringBuilder hex = new StringBuilder();
      for (byte b : raw) {
        hex.append(String.format("%02x", b & 0xff));
      }
      String secret = hex.toString();

      ProcessBuilder pb = new ProcessBuilder(python, "-m", "spark_state.worker", "--socket-dir", dir.toString());
      pb.redirectError(ProcessBuilder.Redirect.appendTo(log.toFile()));
      pb.environment().put("PYTHONUNBUFFERED", "1");
      Process p;
      try {
        p = pb.start();
      } catch (IOException e) {
        throw startFailure(python, source, log, "it could not be run (" + e.getMessage() + ")");
      }
      OutputStream stdin = p.getOutputStream();
      try {
        stdin.write((secret + "\n").getBytes(StandardCharsets.US_ASCII));
        stdin.flush();
      } catch (IOException e) {
        // The process died already; the exit below reports it.
      }
      CompletableFuture<String> ready = new CompletableFuture<>();
      Thread drain = new Thread(() -> {
        try (BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
          String line;
          while ((line = out.readLine()) != null) {
            if (!ready.isDone() && line.startsWith("READY")) {
              ready.complete(line);
            } else {
              LOG.info("spark_state worker: {}", line);
            }
          }
        } catch (IOException ignored) {
          // process ended
        } finally {
          ready.complete(null);
        }
      }, "spark-state-worker-stdout");
      drain.setDaemon(true);
      drain.start();

      String line;
      try {
        line = ready.get(READY_TIMEOUT_SEC, TimeUnit.SECONDS);
      } catch (TimeoutException e) {
        destroy(p, stdin);
        throw startFailure(python, source, log, "it did not print READY within " + READY_TIMEOUT_SEC + " s");
      } catch (Exception e) {
        destroy(p, stdin);
        throw startFailure(python, source, log, "waiting for it failed (" + e + ")");
      }
      if (line == null) {
        String how;
        try {
          how = p.waitFor(5, TimeUnit.SECONDS) ? "it exited with code " + p.exitValue() + " before it was ready"
              : "it closed its stdout before it was ready";
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          how = "it closed its stdout before it was ready";
        }
        destroy(p, stdin);
        throw startFailure(python, source, log, how);
      }
      long pid;
      try {
        pid = Long.parseLong(line.substring("READY".length()).trim());
      } catch (NumberFormatException e) {
        pid = p.pid();
      }
      LOG.info("spark_state: started the state worker (pid {}, python {}, dir {})", pid, python, dir);
      return new Worker(p, dir, secret, python, pid, stdin);
    }

    private static void destroy(Process p, OutputStream stdin) {
      try {
        stdin.close();
      } catch (IOException ignored) {
        // ignore
      }
      p.destroyForcibly();
    }

    private static IllegalStateException startFailure(String python, String source, Path log, String how) {
      String tail = tail(log);
      deleteTree(log.getParent().toFile()); // the tail is in the message; leave nothing in /tmp
      return new IllegalStateException(
          "spark_state: could not start the state worker with Python '" + python + "' (from " + source + "): "
              + how + ".\nLast lines of its log (worker.log):\n" + (tail.isEmpty() ? "(empty)" : tail)
              + "\nFix: set " + PYTHON_OPTION + " to a Python interpreter that has spark_state installed "
              + "(e.g. the one printed by `python -c \"import sys; print(sys.executable)\"` in the environment "
              + "where `import spark_state` works).");
    }

    /** Python that runs the worker: option, spark.pyspark.python, PYSPARK_PYTHON, python3. */
    static String[] choosePython(Map<String, String> options) {
      String v = options.get("python");
      if (v != null && !v.trim().isEmpty()) {
        return new String[] {v.trim(), PYTHON_OPTION};
      }
      org.apache.spark.SparkEnv env = org.apache.spark.SparkEnv.get();
      if (env != null) {
        String c = env.conf().get("spark.pyspark.python", null);
        if (c != null && !c.trim().isEmpty()) {
          return new String[] {c.trim(), "spark.pyspark.python"};
        }
      }
      String e = System.getenv("PYSPARK_PYTHON");
      if (e != null && !e.trim().isEmpty()) {
        return new String[] {e.trim(), "the environment variable PYSPARK_PYTHON"};
      }
      return new String[] {"python3", "the default, since neither " + PYTHON_OPTION
          + ", spark.pyspark.python nor PYSPARK_PYTHON is set"};
    }

    /** A 0700 directory; under /tmp when java.io.tmpdir is too long for a Unix socket path. */
    private static Path privateDir() throws IOException {
      String tmp = System.getProperty("java.io.tmpdir", "/tmp");
      Path base = Paths.get(tmp);
      if (tmp.length() > 60 || !Files.isDirectory(base)) {
        base = Paths.get("/tmp");
      }
      return Files.createTempDirectory(base, "spark-state-",
          PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
    }
  }

  static String tail(Path file) {
    try {
      if (!Files.exists(file)) {
        return "";
      }
      List<String> lines = new ArrayList<>();
      try (Stream<String> s = Files.lines(file, StandardCharsets.UTF_8)) {
        s.forEach(l -> {
          lines.add(l);
          if (lines.size() > LOG_TAIL_LINES) {
            lines.remove(0);
          }
        });
      }
      return String.join("\n", lines);
    } catch (IOException | java.io.UncheckedIOException e) {
      return "(cannot read " + file + ": " + e + ")";
    }
  }

  // ---------------------------------------------------------------- framing

  static final class Reply {
    final JsonNode header;
    final BoundedInputStream body;

    Reply(JsonNode header, BoundedInputStream body) {
      this.header = header;
      this.body = body;
    }
  }

  static final class Connection {
    final Worker worker;
    private final SocketChannel channel;
    private final DataInputStream in;
    private final DataOutputStream out;

    private Connection(Worker worker, SocketChannel channel) {
      this.worker = worker;
      this.channel = channel;
      this.in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(channel), 1 << 16));
      this.out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(channel), 1 << 16));
    }

    static Connection open(Worker w) throws IOException {
      SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
      try {
        ch.connect(UnixDomainSocketAddress.of(w.socket));
        Connection c = new Connection(w, ch);
        ObjectNode hello = header("hello");
        hello.put("secret", w.secret);
        hello.put("protocol", PROTOCOL);
        c.send(hello, null);
        Reply r = c.receive();
        r.body.skipRest();
        if (!r.header.path("ok").asBoolean(false)) {
          throw workerError(r.header);
        }
        return c;
      } catch (IOException | RuntimeException e) {
        ch.close();
        throw e;
      }
    }

    void send(ObjectNode header, ArrowCodec.Body body) throws IOException {
      byte[] h = JSON.writeValueAsBytes(header);
      out.writeInt(h.length);
      out.write(h);
      long n = body == null ? 0 : body.size();
      out.writeLong(n);
      if (n > 0) {
        body.writeTo(out);
      }
      out.flush();
    }

    Reply receive() throws IOException {
      long hlen = in.readInt() & 0xffffffffL;
      if (hlen > (64L << 20)) {
        throw new IOException("reply header of " + hlen + " bytes: not a spark_state worker reply");
      }
      byte[] h = new byte[(int) hlen];
      in.readFully(h);
      JsonNode header = JSON.readTree(h);
      long blen = in.readLong();
      if (blen < 0) {
        throw new IOException("negative reply body length " + blen);
      }
      return new Reply(header, new BoundedInputStream(in, blen));
    }

    void close() {
      try {
        channel.close();
      } catch (IOException ignored) {
        // ignore
      }
    }
  }

  /** Exposes exactly {@code remaining} bytes of the connection; close() does not close it. */
  static final class BoundedInputStream extends FilterInputStream {
    private long remaining;

    BoundedInputStream(InputStream in, long length) {
      super(in);
      this.remaining = length;
    }

    @Override
    public int read() throws IOException {
      if (remaining <= 0) {
        return -1;
      }
      int b = in.read();
      if (b < 0) {
        throw new EOFException("worker reply body truncated");
      }
      remaining--;
      return b;
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
      if (remaining <= 0) {
        return -1;
      }
      int n = in.read(b, off, (int) Math.min(len, remaining));
      if (n < 0) {
        throw new EOFException("worker reply body truncated");
      }
      remaining -= n;
      return n;
    }

    @Override
    public int available() throws IOException {
      return (int) Math.min(in.available(), remaining);
    }

    @Override
    public long skip(long n) throws IOException {
      long s = in.skip(Math.min(n, remaining));
      remaining -= s;
      return s;
    }

    void skipRest() throws IOException {
      byte[] buf = new byte[8192];
      while (remaining > 0) {
        if (read(buf, 0, buf.length) < 0) {
          break;
        }
      }
    }

    @Override
    public void close() {
      // the connection stays open
    }

    @Override
    public boolean markSupported() {
      return false;
    }
  }

  /** Deletes a directory tree (best effort). */
  static void deleteTree(File dir) {
    try (Stream<Path> s = Files.walk(dir.toPath())) {
      s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException ignored) {
      // best effort
    }
  }
}
