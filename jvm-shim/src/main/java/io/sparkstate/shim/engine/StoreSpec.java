package io.sparkstate.shim.engine;

import java.util.function.Consumer;

import org.apache.spark.sql.types.StructType;

/**
 * What the engine needs to know of a store: its rows' shapes, the columns a prefix scan matches
 * ({@code prefixColumns}, 0: no prefix scans), the order of its keys on local disk, and whom to tell
 * when a local file turns out damaged (before the exception reaches Spark), so later loads can avoid
 * local files.
 */
public record StoreSpec(StructType keySchema, int valueFields, int prefixColumns, KeyOrder order,
    Consumer<RowImageException> onDamage) {
  public int keyFields() {
    return keySchema.fields().length;
  }
}
