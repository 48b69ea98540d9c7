/**
 * Rows on the wire (docs/protocol.md): {@link io.sparkstate.shim.codec.RowFormat} (typed struct columns or
 * opaque UnsafeRow bytes, chosen once per store), a batch's {@link io.sparkstate.shim.codec.ChangeLog}
 * (encoded as it happens, streamed to a {@link io.sparkstate.shim.codec.ChunkSink}), the encoders and
 * decoders ({@code TypedCodec}, {@code FlatStructWriter}, {@link io.sparkstate.shim.codec.ArrowCodec}), and
 * {@link io.sparkstate.shim.codec.KeyHasher}: Spark's partition hash of a key and its key group.
 */
package io.sparkstate.shim.codec;
