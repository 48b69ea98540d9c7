package io.sparkstate.shim.codec;

import java.io.IOException;
import java.util.LinkedHashMap;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

/**
 * Changes kept as a map of row copies (one row per key) and encoded by a {@link RowFormat} at commit:
 * the log of opaque rows (file format 1). Linked: commit encodes in insertion (= allocation) order,
 * kinder to caches.
 */
public final class MapChangeLog implements ChangeLog {
  private final RowFormat format;
  private final LinkedHashMap<UnsafeRow, UnsafeRow> rows;

  /** {@code expected}: a guess of the batch's changed keys (sizes the map once). */
  public MapChangeLog(RowFormat format, long expected) {
    this.format = format;
    this.rows = new LinkedHashMap<>((int) Math.max(16, Math.min(expected * 4 / 3 + 1, 1 << 29)));
  }

  @Override
  public void add(UnsafeRow key, UnsafeRow value, boolean again) {   // the map keeps a key once
    rows.put(key.copy(), value == null ? null : value.copy());
  }

  @Override
  public long size() {
    return rows.size();
  }

  @Override
  public ArrowCodec.Body finish() throws IOException {
    try {
      return format.encode(rows.entrySet().stream().map(e -> new UnsafeRowPair(e.getKey(), e.getValue())).iterator(),
          rows.size());
    } finally {
      close();
    }
  }

  @Override
  public void close() {
    rows.clear();
  }
}
