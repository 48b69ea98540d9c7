import java.io.BufferedReader;
import java.io.DataOutputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.List;

import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.InterpretedUnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.GenerateUnsafeProjection;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;

/**
 * Spark's own UnsafeRow bytes for rows given as Arrow, for tests/test_unsaferow.py. One request per
 * stdin line: {@code schemaJson TAB input.arrow TAB outDir}; the input is an Arrow stream whose struct
 * column {@code row} holds the rows (read through ArrowColumnVector, as the shim reads typed state).
 * Each row goes through the generated UnsafeProjection (what UnsafeProjection.create compiles) and
 * through InterpretedUnsafeProjection (its fallback); both are written as {@code i32 length, bytes}
 * per row to outDir/codegen.bin and outDir/interpreted.bin. The generated rows are then converted
 * back to Arrow by Spark's ArrowWriter (as the shim ships state) into outDir/writer.arrow, column
 * {@code row}. Answers {@code OK <rows>} or {@code ERR ...}.
 */
public class UnsafeRowProbe {
  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
    String line;
    while ((line = in.readLine()) != null) {
      try {
        System.out.println(handle(line.split("\t")));
      } catch (Throwable t) {
        System.out.println("ERR " + t.toString().replace('\n', ' '));
      }
      System.out.flush();
    }
  }

  private static String handle(String[] req) throws Exception {
    StructType schema = (StructType) DataType.fromJson(req[0]);
    StructField[] fields = schema.fields();
    List<Expression> refs = new ArrayList<>();
    for (int i = 0; i < fields.length; i++) {
      refs.add(new BoundReference(i, fields[i].dataType(), fields[i].nullable()));
    }
    UnsafeProjection generated = GenerateUnsafeProjection.generate(
        scala.jdk.javaapi.CollectionConverters.asScala(refs).toList(), false);
    UnsafeProjection interpreted = new InterpretedUnsafeProjection(refs.toArray(new Expression[0]));

    List<UnsafeRow> rows = new ArrayList<>();
    List<UnsafeRow> fallback = new ArrayList<>();
    try (InputStream f = new FileInputStream(req[1]);
         RootAllocator alloc = new RootAllocator(Long.MAX_VALUE);
         ArrowStreamReader reader = new ArrowStreamReader(f, alloc)) {
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      while (reader.loadNextBatch()) {
        ArrowColumnVector column = new ArrowColumnVector(root.getVector("row"));
        for (int i = 0; i < root.getRowCount(); i++) {
          rows.add(generated.apply(column.getStruct(i)).copy());
          fallback.add(interpreted.apply(column.getStruct(i)).copy());
        }
      }
    }
    writeRows(rows, req[2] + "/codegen.bin");
    writeRows(fallback, req[2] + "/interpreted.bin");
    writeArrow(schema, rows, req[2] + "/writer.arrow");
    return "OK " + rows.size();
  }

  private static void writeRows(List<UnsafeRow> rows, String path) throws Exception {
    try (DataOutputStream out = new DataOutputStream(new FileOutputStream(path))) {
      for (UnsafeRow row : rows) {
        out.writeInt(row.getSizeInBytes());
        out.write(row.getBytes());
      }
    }
  }

  private static void writeArrow(StructType schema, List<UnsafeRow> rows, String path) throws Exception {
    StructType rowType = DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("row", schema, false)});
    ArrowWriter writer = ArrowWriter.create(rowType, "UTC", false, false);
    VectorSchemaRoot root = writer.root();
    try (OutputStream out = new FileOutputStream(path);
         ArrowStreamWriter stream = new ArrowStreamWriter(root, null, out)) {
      stream.start();
      for (UnsafeRow row : rows) {
        writer.write(new GenericInternalRow(new Object[] {row}));
      }
      writer.finish();
      stream.writeBatch();
      stream.end();
    } finally {
      root.close();
    }
  }
}
