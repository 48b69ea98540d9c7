package io.sparkstate.shim.worker;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.sparkstate.shim.codec.ArrowCodec;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;

/**
 * The worker's operations on one store as typed calls, one method per {@code op_*} of the Python
 * {@code Dispatcher} the shim uses (spark_state/worker/server.py; docs/protocol.md, "Requests"):
 * every request's op and field names are written here and nowhere else ({@code hello} opens a
 * {@link WorkerConnection}; the shim sends no {@code latest} or {@code shutdown}). Connections,
 * retries and worker restarts are the {@link WorkerClient}'s. Thread-safe.
 */
public final class StoreClient {
  static final String OP_VALIDATE = "validate";
  static final String OP_LOAD = "load";
  static final String OP_STAGE = "stage";
  static final String OP_COMMIT = "commit";
  static final String OP_ABORT = "abort";
  static final String OP_MAINTENANCE = "maintenance";
  static final String OP_CHANGES = "changes";
  static final String OP_REPLAY = "replay";
  static final String OP_DRAIN = "drain";
  static final String OP_FETCH = "fetch";
  static final String OP_CHANGES_AFTER_IMAGE = "changesAfterImage";
  /**
   * Whether lazy loads of remote images ask for their changes to come after the open ({@code defer}; a
   * system property for A/B runs of benchmarks, on by default).
   */
  static final boolean DEFER_CHANGES = !"false".equals(System.getProperty("spark_state.deferChanges"));

  private static final JsonNodeFactory NODES = JsonNodeFactory.instance;
  /** Option sets the worker validated in this JVM (validate once per distinct set), with the reply. */
  private static final Map<Options, JsonNode> VALIDATED = new ConcurrentHashMap<>();

  /**
   * Reads a {@code load} reply's state stream while the connection is held; runs again on a retry.
   * {@code image}: the row image the rows apply to (then they are changes, deletes as null values), or null.
   */
  public interface Loader<T> {
    T read(long rows, String commitId, Image image, InputStream state) throws IOException;
  }

  /**
   * The row image a lazy {@code load} names: the version's snapshot as a local file of UnsafeRows, or an image
   * on remote checkpoint storage read by byte range ({@link #remote}; docs/protocol.md, "Row images on remote
   * storage").
   */
  public static final class Image {
    /** The local file, or null for a remote image. */
    public final Path path;
    public final long rows;
    public final long size;
    /** A copy the worker downloaded for this load: the shim deletes it once open. */
    public final boolean temporary;
    /** The snapshot's file format: typed (2) or opaque (1), as {@code load} of its rows would report. */
    public final boolean typed;
    /** The version's exact key count, when the worker knows it (docs/protocol.md, "Key counts"), else -1. */
    public final long keys;
    /** A remote image: its path in the store ({@link #fetch} reads it), and its storage root joined to it. */
    public final String file;
    public final String id;
    public final String checksum;
    /** A remote image's tail: byte ranges [tailFrom[i], tailTo[i]) and their bytes, read from the reply. */
    public final long[] tailFrom;
    public final long[] tailTo;
    public final byte[][] tail;
    /**
     * A remote image whose changes the worker is still reading (a deferred load): the token
     * {@link #changesAfterImage} takes them by, or null (the changes followed the tail in the reply).
     */
    public final String deferred;

    Image(JsonNode node, JsonNode reply, InputStream body) throws IOException {
      this.keys = reply.hasNonNull("keys") ? reply.get("keys").asLong(-1) : -1;
      this.deferred = reply.hasNonNull("deferred") ? reply.get("deferred").asText() : null;
      this.rows = node.path("rows").asLong(0);
      this.size = node.path("size").asLong(-1);
      this.temporary = node.path("temporary").asBoolean(false);
      this.typed = node.path("fileFormat").asInt(2) != 1;
      JsonNode ranges = node.get("tail");
      if (ranges == null || !ranges.isArray()) {
        this.path = Paths.get(node.path("path").asText());
        this.file = this.id = this.checksum = null;
        this.tailFrom = this.tailTo = null;
        this.tail = null;
        return;
      }
      this.path = null;
      this.file = node.path("file").asText();
      this.id = node.path("id").asText(file);
      this.checksum = node.path("checksum").asText("");
      int n = ranges.size();
      this.tailFrom = new long[n];
      this.tailTo = new long[n];
      this.tail = new byte[n][];
      DataInputStream in = new DataInputStream(body);
      for (int i = 0; i < n; i++) {
        tailFrom[i] = ranges.get(i).get(0).asLong();
        tailTo[i] = ranges.get(i).get(1).asLong();
        long length = tailTo[i] - tailFrom[i];
        if (length < 0 || length > Integer.MAX_VALUE - 16 || tailTo[i] > size) {
          throw new IOException("a load reply names the row image tail range " + ranges.get(i) + " of " + size + " bytes");
        }
        tail[i] = new byte[(int) length];
        in.readFully(tail[i]);
      }
    }

    /** Whether the image is on remote storage, read by range. */
    public boolean remote() {
      return tail != null;
    }
  }

  /**
   * The worker found a checkpoint file not what its manifest says (error kind {@code ChecksumMismatch}): damaged,
   * gone, or shorter. A retry reads the same file.
   */
  public static final class Damaged extends IllegalStateException {
    Damaged(String message) {
      super(message);
    }
  }

  /** The worker's maintenance status of a store: consecutive failed runs and the last error (null: none). */
  public static final class Maintenance {
    public final long failures;
    public final String error;

    Maintenance(JsonNode reply) {
      this.failures = reply.path("maintenanceFailures").asLong(0);
      this.error = failures > 0 ? reply.path("maintenanceError").asText(null) : null;
    }
  }

  /** A {@code commit} reply: bytes written to storage, the new version's commit id, maintenance status. */
  public static final class Committed {
    public final long bytes;
    public final String commitId;
    public final Maintenance maintenance;

    Committed(JsonNode reply) {
      this.bytes = reply.path("bytes").asLong(0);
      this.commitId = reply.path("commitId").asText(null);
      this.maintenance = new Maintenance(reply);
    }
  }

  private final WorkerClient worker;
  private final boolean lineages;
  private final Options options;
  private final ObjectNode optionsNode;
  private final LongAdder restarts = new LongAdder();
  /** The store's identity as requests send it; replaced whole (never mutated), so requests need no lock. */
  private volatile ObjectNode store;

  public StoreClient(WorkerClient worker, StateStoreId id, Options options) {
    this(worker, id, options, false);
  }

  /**
   * {@code lineages}: Spark names versions by checkpoint id (checkpoint format v2): every commit keeps its
   * manifest loadable by its commit id and builds on the base commit it names (docs/protocol.md, "Lineages").
   */
  public StoreClient(WorkerClient worker, StateStoreId id, Options options, boolean lineages) {
    this.lineages = lineages;
    this.worker = worker;
    this.options = options;
    this.optionsNode = optionsNode(options);
    ObjectNode store = NODES.objectNode();
    store.put("sparkRoot", id.checkpointRootLocation());
    store.put("location", id.storeCheckpointLocation().toUri().toString());
    store.put("operator", id.operatorId());
    store.put("partition", id.partitionId());
    store.put("name", id.storeName());
    this.store = store;
  }

  /**
   * {@code validate}: the worker checks an option set (once per distinct set in this JVM) and answers
   * the memory limit it sets (bytes, or null for the default), which the caller gives the executor's budget.
   */
  public static Long validate(WorkerClient worker, Options options) {
    return bytes(validated(worker, options), "memoryLimit");
  }

  /**
   * The bound of the executor's local copies of remote row images the option set gives (bytes, or null for
   * the default), from the same {@code validate} reply.
   */
  public static Long imageCacheSize(WorkerClient worker, Options options) {
    return bytes(validated(worker, options), "imageCacheSize");
  }

  private static JsonNode validated(WorkerClient worker, Options options) {
    JsonNode reply = VALIDATED.get(options);
    if (reply == null) {
      ObjectNode h = NODES.objectNode();
      h.put("op", OP_VALIDATE);
      h.set("options", optionsNode(options));
      reply = worker.call(h, null, null, options, null);
      reply = reply == null ? NODES.objectNode() : reply;
      VALIDATED.put(options, reply);
    }
    return reply;
  }

  private static Long bytes(JsonNode reply, String field) {
    JsonNode bytes = reply.get(field);
    return bytes == null || bytes.isNull() ? null : bytes.asLong();
  }

  /** Names the running query in the store's identity (without it the worker reads the checkpoint's metadata). */
  public void useQueryId(String queryId) {
    if (queryId != null && !queryId.equals(store.path("queryId").asText(null))) {
      ObjectNode node = store.deepCopy();
      node.put("queryId", queryId);
      store = node;
    }
  }

  /**
   * What {@link #load} answers: what the loader read (null when the caller's copy is current), and the bytes of
   * checkpoint data files the worker read from storage to answer (chain files, a row image downloaded whole
   * or its tail; 0 when unchanged).
   */
  public record Answer<T>(T value, long bytesRead) {
  }

  /** Worker restarts this store's requests made. */
  public long restarts() {
    return restarts.sum();
  }

  /**
   * {@code load}: the rows of {@code version}, read by {@code loader}; or a null value when {@code knownCommitId}
   * is what storage still holds for it (the caller's copy is current). {@code images}: the caller looks keys
   * up in row images, so the worker may name the snapshot's image and send only the changes after it.
   */
  public <T> Answer<T> load(long version, String knownCommitId, boolean images, Loader<T> loader) {
    return load(version, knownCommitId, null, images, loader);
  }

  /**
   * {@code load} of one commit of {@code version}: {@code checkpointId} (null: the latest commit) is the commit
   * id Spark names the version by (checkpoint format v2); the worker fails when storage holds no such commit.
   */
  public <T> Answer<T> load(long version, String knownCommitId, String checkpointId, boolean images,
      Loader<T> loader) {
    return load(version, knownCommitId, checkpointId, images, images, loader);
  }

  /**
   * {@code load} whose remote row image comes by range ({@code ranges}: its tail, then {@code fetch}es) as the
   * option {@code rowImages.rangeReads} decides, or, with {@code ranges} false, downloaded into the worker's
   * directory whatever the option says (an executor whose local copy of remote images cannot be made).
   */
  public <T> Answer<T> load(long version, String knownCommitId, String checkpointId, boolean images, boolean ranges,
      Loader<T> loader) {
    ObjectNode h = request(OP_LOAD);
    h.put("version", version);
    if (knownCommitId != null) {
      h.put("commitId", knownCommitId);
    }
    if (checkpointId != null) {
      h.put("checkpointId", checkpointId);
    }
    if (images) {
      h.put("images", true);
      h.put("ranges", ranges);
      if (ranges && DEFER_CHANGES) {
        h.put("defer", true);
      }
    }
    return send(h, null, (reply, body) -> new Answer<>(reply.path("unchanged").asBoolean(false) ? null
        : loader.read(reply.path("rows").asLong(0), reply.path("commitId").asText(null),
            reply.hasNonNull("image") ? new Image(reply.get("image"), reply, body) : null, body),
        reply.path("bytesRead").asLong(0)));
  }

  /** Reads the bytes a {@link #fetch} answers, exactly the ranges' lengths one after the other. */
  public interface Fetched {
    void read(InputStream bytes) throws IOException;
  }

  /**
   * {@code fetch}: the byte ranges [from[i], to[i]) of the store's file {@code file} (a remote row image,
   * by its path in the store), read by {@code body} while the connection is held. The worker's failure to read
   * them (storage) is an {@link IllegalStateException}.
   */
  public void fetch(String file, long[] from, long[] to, Fetched body) {
    ObjectNode h = request(OP_FETCH);
    h.put("file", file);
    com.fasterxml.jackson.databind.node.ArrayNode ranges = h.putArray("ranges");
    for (int i = 0; i < from.length; i++) {
      ranges.addArray().add(from[i]).add(to[i]);
    }
    send(h, null, (reply, in) -> {
      JsonNode lengths = reply.path("lengths");
      if (lengths.size() != from.length) {
        throw new IOException("a fetch reply of " + lengths.size() + " ranges for " + from.length);
      }
      for (int i = 0; i < from.length; i++) {
        if (lengths.get(i).asLong() != to[i] - from[i]) {
          throw new IOException("a fetch reply of " + lengths.get(i) + " bytes for the range " + from[i] + ".." + to[i]);
        }
      }
      body.read(in);
      return null;
    });
  }

  /**
   * {@code stage}: chunk {@code seq} (from 0) of {@code version}'s changes, streamed as {@code stream}
   * while the batch runs, or of its whole state ({@code whole}: the file is a snapshot); the worker writes
   * it into the data file the commit will name.
   */
  public void stage(long version, String stream, int seq, boolean whole, ArrowCodec.Body chunk) {
    ObjectNode h = request(OP_STAGE);
    if (whole) {
      h.put("full", true);
    }
    h.put("version", version);
    h.put("stream", stream);
    h.put("seq", seq);
    send(h, chunk, null);
  }

  /**
   * {@code commit}: makes {@code version} durable, built on {@code baseCommitId} (storage's commit of
   * version-1, null for version 1; the worker refuses a stale one). {@code whole}: the body is the
   * whole state, not changes; {@code repeatedKeys}: the changes may name a key more than once;
   * {@code stream} (null: none): the changes begin with the {@code chunks} chunks staged as it, and the
   * body is the rest ({@link WorkerConnection.StreamLost} when the worker does not hold them); {@code keys}:
   * the new version's exact key count (-1: unknown).
   */
  public Committed commit(long version, String baseCommitId, int minVersionsToRetain, boolean whole, boolean repeatedKeys,
      String stream, int chunks, long keys, ArrowCodec.Body body) {
    ObjectNode h = request(OP_COMMIT);
    if (keys >= 0) {
      h.put("keys", keys);
    }
    if (whole) {
      h.put("full", true);
    }
    if (repeatedKeys) {
      h.put("repeatedKeys", true);
    }
    if (stream != null) {
      h.put("stream", stream);
      h.put("chunks", chunks);
    }
    if (lineages) {
      h.put("lineage", true);
    }
    h.put("version", version);
    h.put("baseCommitId", baseCommitId);
    h.put("minVersionsToRetain", minVersionsToRetain);
    return new Committed(send(h, body, null));
  }

  /**
   * {@code abort}: the worker drops what it may hold of an uncommitted {@code version}: the chunks
   * streamed as {@code stream} (null: none) and files no manifest names. Callers clean up after a failed or
   * killed task, whose thread may still be interrupted: the flag would close the worker's channel under the
   * write (ClosedByInterruptException), so it is cleared for the request and set again after.
   */
  public void abort(long version, String stream) {
    ObjectNode h = request(OP_ABORT);
    h.put("version", version);
    if (stream != null) {
      h.put("stream", stream);
    }
    boolean interrupted = Thread.interrupted();
    try {
      send(h, null, null);
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /**
   * {@code drain}: waits until the worker's background work (compactions, row images) is done or
   * {@code timeoutMs} passed; answers the jobs still queued or running.
   */
  public static long drain(WorkerClient worker, Options options, long timeoutMs) {
    ObjectNode h = NODES.objectNode();
    h.put("op", OP_DRAIN);
    h.put("timeoutMs", timeoutMs);
    JsonNode reply = worker.call(h, null, null, options, null);
    return reply == null ? 0 : reply.path("pending").asLong(0);
  }

  /** {@code maintenance}: queues compaction and retention around {@code version} (the one this JVM holds). */
  public Maintenance maintenance(long version, int minVersionsToRetain) {
    ObjectNode h = request(OP_MAINTENANCE);
    h.put("minVersionsToRetain", minVersionsToRetain);
    h.put("version", version);
    return new Maintenance(send(h, null, null));
  }

  /**
   * {@code changes}: the changes {@code version}'s commit recorded (deletes as null values), read by
   * {@code loader}; with {@code through >= version} the worker first checks that every version up to
   * {@code through} has its changes recorded.
   */
  public <T> T changes(long version, long through, Loader<T> loader) {
    ObjectNode h = request(OP_CHANGES);
    h.put("version", version);
    if (through >= version) {
      h.put("through", through);
    }
    return send(h, null, (reply, body) -> loader.read(reply.path("rows").asLong(0), null, null, body));
  }

  /**
   * {@code changesAfterImage}: the changes of a deferred load of {@code version} (commit {@code commitId}, of
   * Spark's {@code checkpointId} if not null) after its remote {@code image}, read by {@code loader} (no
   * commit id, no image); answers the bytes the worker read for them. A worker that lost the token (a new one)
   * reads them again; storage that no longer holds that commit over that image fails it ({@code StaleState}).
   */
  public <T> Answer<T> changesAfterImage(long version, String commitId, String checkpointId, Image image,
      Loader<T> loader) {
    ObjectNode h = request(OP_CHANGES_AFTER_IMAGE);
    h.put("version", version);
    h.put("commitId", commitId);
    if (checkpointId != null) {
      h.put("checkpointId", checkpointId);
    }
    h.put("file", image.file);
    h.put("deferred", image.deferred);
    return send(h, null, (reply, body) -> new Answer<>(loader.read(reply.path("rows").asLong(0), null, null, body),
        reply.path("bytesRead").asLong(0)));
  }

  /** {@code replay}: the state at {@code version} rebuilt from {@code snapshotVersion}, read by {@code loader}. */
  public <T> T replay(long snapshotVersion, long version, Loader<T> loader) {
    ObjectNode h = request(OP_REPLAY);
    h.put("snapshotVersion", snapshotVersion);
    h.put("version", version);
    return send(h, null, (reply, body) -> loader.read(reply.path("rows").asLong(0),
        reply.path("commitId").asText(null), null, body));
  }

  private ObjectNode request(String op) {
    ObjectNode h = NODES.objectNode();
    h.put("op", op);
    h.set("store", store);
    h.set("options", optionsNode);
    return h;
  }

  private <T> T send(ObjectNode header, ArrowCodec.Body body, WorkerConnection.BodyReader<T> reader) {
    return worker.call(header, body, reader, options, restarts);
  }

  private static ObjectNode optionsNode(Options options) {
    ObjectNode o = NODES.objectNode();
    for (Map.Entry<String, String> e : options.asMap().entrySet()) {
      o.put(e.getKey(), e.getValue());
    }
    return o;
  }
}
