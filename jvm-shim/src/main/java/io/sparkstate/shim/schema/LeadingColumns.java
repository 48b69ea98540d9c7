package io.sparkstate.shim.schema;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The leading {@code n} columns of a key schema as generated code reads them: the columns a key's hash covers
 * (the codec's KeyHasher), the prefix a session window's store scans by (the engine's KeyPrefix).
 */
public final class LeadingColumns {
  private LeadingColumns() {}

  /** References to the leading {@code n} columns of a row of {@code schema}, for an expression over them. */
  public static scala.collection.immutable.Seq<Expression> refs(StructType schema, int n) {
    StructField[] fields = schema.fields();
    List<Expression> refs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      refs.add(new BoundReference(i, fields[i].dataType(), fields[i].nullable()));
    }
    return CollectionConverters.asScala(refs).toList();
  }

  /**
   * What code generated over the leading {@code n} columns depends on (their types and nullability, not their
   * names): the key under which code generated for one schema serves another.
   */
  public static List<Object> identity(StructType schema, int n) {
    List<Object> id = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      id.add(schema.fields()[i].dataType());
      id.add(schema.fields()[i].nullable());
    }
    return id;
  }
}
