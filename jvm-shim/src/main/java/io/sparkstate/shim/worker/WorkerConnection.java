package io.sparkstate.shim.worker;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.sparkstate.shim.codec.ArrowCodec;

/**
 * One authenticated connection to a {@link WorkerProcess}: the frames of docs/protocol.md
 * ({@code u32 header_len | JSON header | u64 body_len | body}), the {@code hello} that opens it, and
 * error replies turned into exceptions. The Python side is {@code spark_state/worker/protocol.py}
 * and the connection handler of {@code server.py}. Not thread-safe: one request at a time.
 */
final class WorkerConnection {
  /** The protocol version {@code hello} announces ({@code PROTOCOL_VERSION} of protocol.py). */
  static final int PROTOCOL = 1;
  static final String OP_HELLO = "hello";
  /** The error kind of a bad option value: the user's {@link IllegalArgumentException}. */
  static final String KIND_OPTION_ERROR = "OptionError";
  /** The error kind of a streamed commit whose chunks the worker does not hold: {@link StreamLost}. */
  static final String KIND_STREAM_LOST = "StreamLost";
  /** The error kind of a file that is not what its manifest says: {@link StoreClient.Damaged}. */
  static final String KIND_CHECKSUM_MISMATCH = "ChecksumMismatch";
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final long MAX_REPLY_HEADER = 64L << 20;

  /** Reads a reply body (an Arrow stream) while the connection is held. */
  interface BodyReader<T> {
    T read(JsonNode header, InputStream body) throws IOException;
  }

  final WorkerProcess worker;
  private final SocketChannel channel;
  private final DataInputStream in;
  private final DataOutputStream out;

  private WorkerConnection(WorkerProcess worker, SocketChannel channel) {
    this.worker = worker;
    this.channel = channel;
    this.in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(channel), 1 << 16));
    this.out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(channel), 1 << 16));
  }

  /** Connects to {@code worker}'s socket and authenticates with its secret. */
  static WorkerConnection open(WorkerProcess worker) throws IOException {
    SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
    try {
      ch.connect(UnixDomainSocketAddress.of(worker.socket));
      WorkerConnection c = new WorkerConnection(worker, ch);
      ObjectNode hello = JSON.createObjectNode();
      hello.put("op", OP_HELLO);
      hello.put("secret", worker.secret);
      hello.put("protocol", PROTOCOL);
      c.exchange(hello, null, null);
      return c;
    } catch (IOException | RuntimeException e) {
      ch.close();
      throw e;
    }
  }

  /**
   * Sends one request and reads its reply. The reader gets the reply body (without a reader the reply
   * header is returned and the body skipped); an error reply throws, and the connection stays usable.
   * IOException: the connection is broken.
   */
  @SuppressWarnings("unchecked")
  <T> T exchange(ObjectNode header, ArrowCodec.Body body, BodyReader<T> reader) throws IOException {
    send(header, body);
    JsonNode reply = readHeader();
    BoundedInputStream replyBody = new BoundedInputStream(in, in.readLong());
    try {
      if (!reply.path("ok").asBoolean(false)) {
        throw error(reply);
      }
      return reader == null ? (T) reply : reader.read(reply, replyBody);
    } finally {
      replyBody.skipRest();
    }
  }

  void close() {
    try {
      channel.close();
    } catch (IOException ignored) {
      // ignore
    }
  }

  private void send(ObjectNode header, ArrowCodec.Body body) throws IOException {
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

  private JsonNode readHeader() throws IOException {
    long n = in.readInt() & 0xffffffffL;
    if (n > MAX_REPLY_HEADER) {
      throw new IOException("reply header of " + n + " bytes: not a spark_state worker reply");
    }
    byte[] h = new byte[(int) n];
    in.readFully(h);
    return JSON.readTree(h);
  }

  /** The exception an error reply {@code {"ok": false, "kind": ..., "error": ...}} becomes. */
  private static RuntimeException error(JsonNode reply) {
    String msg = "spark_state: " + reply.path("error").asText("(no message)");
    String kind = reply.path("kind").asText();
    if (KIND_OPTION_ERROR.equals(kind)) {
      return new IllegalArgumentException(msg);
    }
    if (KIND_STREAM_LOST.equals(kind)) {
      return new StreamLost(msg);
    }
    if (KIND_CHECKSUM_MISMATCH.equals(kind)) {
      return new StoreClient.Damaged(msg);
    }
    return new IllegalStateException(msg);
  }

  /** The worker does not hold the chunks a streamed commit names (restarted since): they are sent again. */
  static final class StreamLost extends IllegalStateException {
    StreamLost(String message) {
      super(message);
    }
  }

  /** Exposes exactly {@code remaining} bytes of the connection; close() does not close it. */
  private static final class BoundedInputStream extends FilterInputStream {
    private long remaining;

    BoundedInputStream(InputStream in, long length) throws IOException {
      super(in);
      if (length < 0) {
        throw new IOException("negative reply body length " + length);
      }
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
}
