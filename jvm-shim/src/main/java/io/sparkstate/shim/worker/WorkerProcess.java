package io.sparkstate.shim.worker;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Stream;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One worker process ({@code spark_state.worker}'s main; docs/protocol.md, "Start-up"): a private 0700
 * directory holding its socket and log, a random secret on its stdin (never argv), its
 * {@code READY <pid>} line awaited. It exits when its stdin closes, so it never outlives this JVM.
 */
final class WorkerProcess {
  private static final Logger LOG = LoggerFactory.getLogger(WorkerProcess.class);
  /** The bootstrap's exit code when Python cannot import the worker; its last line on stderr says why. */
  static final int IMPORT_FAILED = 3;
  /**
   * What the worker's Python runs ({@code -c}): the worker's main without the working directory on
   * {@code sys.path} (what {@code -P} does from Python 3.11 on), so nothing where the executor was started
   * (a {@code spark_state/} directory, a {@code pyarrow.py}) shadows an installed package; when the
   * worker cannot be imported, one line that says why and where {@code spark_state} came from.
   */
  static final String BOOTSTRAP = String.join("\n",
      "import sys",
      "if sys.path[:1] == ['']: del sys.path[0]",
      "try:",
      "    from spark_state.worker.__main__ import main",
      "except Exception as e:",
      "    import importlib.util",
      "    s = importlib.util.find_spec('spark_state')",
      "    at = s and (s.origin if s.has_location else list(s.submodule_search_locations or ())) or 'nowhere'",
      "    print(f'cannot import spark_state.worker ({type(e).__name__}: {e}); spark_state found at {at}', "
          + "file=sys.stderr)",
      "    sys.exit(" + IMPORT_FAILED + ")",
      "sys.exit(main(sys.argv[1:]))");
  private static final long READY_TIMEOUT_SEC = 60;
  private static final int LOG_TAIL_LINES = 30;

  final long pid;
  final Path socket;
  final String secret;
  private final Process process;
  private final Path dir;
  private final OutputStream stdin;

  private WorkerProcess(Process process, long pid, Path dir, String secret, OutputStream stdin) {
    this.process = process;
    this.pid = pid;
    this.dir = dir;
    this.socket = dir.resolve("worker.sock");
    this.secret = secret;
    this.stdin = stdin;
  }

  /** Starts a worker and waits for it to be ready; fails with the Python it tried, its log and the fix. */
  static WorkerProcess start(Options options) {
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
    String secret = newSecret();

    ProcessBuilder pb = new ProcessBuilder(python, "-c", BOOTSTRAP, "--socket-dir", dir.toString());
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
    String line;
    try {
      line = readyLine(p).get(READY_TIMEOUT_SEC, TimeUnit.SECONDS);
    } catch (TimeoutException e) {
      destroy(p, stdin);
      throw startFailure(python, source, log, "it did not print READY within " + READY_TIMEOUT_SEC + " s");
    } catch (Exception e) {
      destroy(p, stdin);
      throw startFailure(python, source, log, "waiting for it failed (" + e + ")");
    }
    if (line == null) {
      String how;
      int exit = -1;
      try {
        exit = p.waitFor(5, TimeUnit.SECONDS) ? p.exitValue() : -1;
        how = exit >= 0 ? "it exited with code " + exit + " before it was ready"
            : "it closed its stdout before it was ready";
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        how = "it closed its stdout before it was ready";
      }
      destroy(p, stdin);
      throw exit == IMPORT_FAILED ? importFailure(python, source, log) : startFailure(python, source, log, how);
    }
    long pid;
    try {
      pid = Long.parseLong(line.substring("READY".length()).trim());
    } catch (NumberFormatException e) {
      pid = p.pid();
    }
    LOG.info("spark_state: started the state worker (pid {}, python {}, dir {})", pid, python, dir);
    return new WorkerProcess(p, pid, dir, secret, stdin);
  }

  /** The worker's log file (its stderr). */
  Path log() {
    return dir.resolve("worker.log");
  }

  /** The last lines of the worker's log. */
  String logTail() {
    return tail(log());
  }

  /** Waits up to {@code seconds} for the process to exit (a failed connection: it may be dying). */
  void awaitExit(long seconds) {
    try {
      process.waitFor(seconds, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * Why no new connection can reach this worker, or null: it exited, or it is alive but its socket
   * file is gone (a temp-file cleaner; open connections outlive it, new ones cannot be made).
   */
  String unreachable() {
    if (!process.isAlive()) {
      return "exited with code " + process.exitValue();
    }
    if (!Files.exists(socket)) {
      return "is alive but its socket " + socket + " is gone (deleted by a temp-file cleaner?)";
    }
    return null;
  }

  /** Stops the process (stdin EOF, then signals) and deletes its directory. */
  void stop() {
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
    deleteTree(dir);
  }

  /** Completes with the worker's READY line, or null when its stdout ends first; logs its other lines. */
  private static CompletableFuture<String> readyLine(Process p) {
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
    return ready;
  }

  private static String newSecret() {
    byte[] raw = new byte[32];
    new SecureRandom().nextBytes(raw);
    StringBuilder hex = new StringBuilder();
    for (byte b : raw) {
      hex.append(String.format("%02x", b & 0xff));
    }
    return hex.toString();
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
    deleteTree(log.getParent()); // the tail is in the message; leave nothing in /tmp
    return new IllegalStateException(
        "spark_state: could not start the state worker with Python '" + python + "' (from " + source + "): "
            + how + ".\nLast lines of its log (worker.log):\n" + (tail.isEmpty() ? "(empty)" : tail)
            + "\nFix: set " + Options.PREFIX + Options.PYTHON + " to a Python interpreter that has spark_state "
            + "installed (e.g. the one printed by `python -c \"import sys; print(sys.executable)\"` in the "
            + "environment where `import spark_state` works).");
  }

  /** The worker's Python cannot import spark_state's worker: one line, the bootstrap's, and the fix. */
  private static IllegalStateException importFailure(String python, String source, Path log) {
    String[] lines = tail(log).split("\n");
    deleteTree(log.getParent());
    return new IllegalStateException("spark_state: the state worker's Python '" + python + "' (from " + source
        + ") " + lines[lines.length - 1].trim() + ". Fix: install spark_state into that Python, or set "
        + Options.PREFIX + Options.PYTHON + " to one where `import spark_state.worker` works.");
  }

  /** Python that runs the worker and where it came from: option, spark.pyspark.python, PYSPARK_PYTHON, python3. */
  static String[] choosePython(Options options) {
    String option = Options.PREFIX + Options.PYTHON;
    if (options.python() != null) {
      return new String[] {options.python(), option};
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
    return new String[] {"python3", "the default, since neither " + option
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

  private static String tail(Path file) {
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
    } catch (IOException | UncheckedIOException e) {
      return "(cannot read " + file + ": " + e + ")";
    }
  }

  /** Deletes a directory tree (best effort). */
  private static void deleteTree(Path dir) {
    try (Stream<Path> s = Files.walk(dir)) {
      s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException ignored) {
      // best effort
    }
  }
}
