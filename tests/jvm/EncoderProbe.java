package io.sparkstate.shim.codec;

import java.io.BufferedReader;
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
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;

/**
 * Encodes the same rows with TypedCodec's FlatStructWriter path and with Spark's ArrowWriter
 * (TypedCodec.arrowWriterOnly), for tests/test_flat_encoder.py. One request per
 * stdin line: {@code keySchemaJson TAB valueSchemaJson TAB input.arrow TAB outDir}; the input is an
 * Arrow stream with struct columns {@code key} and {@code value} (null value = delete), turned into
 * UnsafeRows through ArrowColumnVector and UnsafeProjection. Writes outDir/flat.arrow and
 * outDir/writer.arrow and answers {@code OK <flat>} (whether the flat path was taken) or {@code ERR ...}.
 */
public class EncoderProbe {
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
    StructType key = (StructType) DataType.fromJson(req[0]);
    StructType value = (StructType) DataType.fromJson(req[1]);
    List<UnsafeRowPair> rows = read(req[2], key, value);
    TypedCodec flat = TypedCodec.forSchemas(key, value);
    TypedCodec writer = TypedCodec.arrowWriterOnly(key, value);
    if (flat == null || writer == null || writer.flat()) {
      return "ERR no typed codec for " + key.simpleString() + " / " + value.simpleString();
    }
    KeyHasher hasher = new KeyHasher(key, key.fields().length, 16);
    write(flat.encode(rows.iterator(), rows.size(), hasher), req[3] + "/flat.arrow");
    write(writer.encode(rows.iterator(), rows.size(), hasher), req[3] + "/writer.arrow");
    return "OK " + flat.flat();
  }

  private static List<UnsafeRowPair> read(String path, StructType key, StructType value) throws Exception {
    List<UnsafeRowPair> rows = new ArrayList<>();
    UnsafeProjection kp = UnsafeProjection.create(key);
    UnsafeProjection vp = UnsafeProjection.create(value);
    try (InputStream f = new FileInputStream(path);
         RootAllocator alloc = new RootAllocator(Long.MAX_VALUE);
         ArrowStreamReader reader = new ArrowStreamReader(f, alloc)) {
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      while (reader.loadNextBatch()) {
        ArrowColumnVector k = new ArrowColumnVector(root.getVector("key"));
        ArrowColumnVector v = new ArrowColumnVector(root.getVector("value"));
        for (int i = 0; i < root.getRowCount(); i++) {
          UnsafeRow kr = kp.apply(k.getStruct(i)).copy();
          UnsafeRow vr = v.isNullAt(i) ? null : vp.apply(v.getStruct(i)).copy();
          rows.add(new UnsafeRowPair(kr, vr));
        }
      }
    }
    return rows;
  }

  private static void write(ArrowCodec.Body body, String path) throws Exception {
    try (OutputStream out = new FileOutputStream(path)) {
      body.writeTo(out);
    }
  }
}
