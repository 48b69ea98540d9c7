package io.sparkstate.shim.engine;

import io.sparkstate.shim.codec.KeyHasher;
import io.sparkstate.shim.memory.MemoryBudget;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.RandomAccessFile;
import java.lang.reflect.Field;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.stream.Stream;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The engine as a whole, several stores on one {@link MemoryBudget}, for tests/jvm/test_engine.py; one command
 * a line, one answer line ("OK ..." with figures, or "BAD what went wrong"):
 * <pre>
 *   budget SEED OPS STORES  → OK figures          (see {@link #budget})
 *   release                 → OK figures          (see {@link #release}; after "budget")
 *   damage MODE             → OK figures | BAD    (see {@link #damage}; MODE flip or truncate)
 *   vanish                  → OK figures | BAD    (see {@link #vanish})
 *   forgotten WHEN          → OK rows | THREW msg (see {@link #forgotten}; WHEN close or batch)
 *   filters                 → OK figures | BAD    (see {@link #filters})
 * </pre>
 * Stores are plain (one string key column) or prefix-scan ones (a string prefix and an int, hashed by the
 * prefix: session windows' stores); both keep values of a string and its length.
 */
public class EngineProbe {
  static final StructType KEY = new StructType().add("k", DataTypes.StringType, false);
  static final StructType PKEY = new StructType().add("p", DataTypes.StringType, false).add("s", DataTypes.IntegerType, false);
  static final StructType PREFIX = new StructType().add("p", DataTypes.StringType, false);
  static final StructType VALUE = new StructType().add("v", DataTypes.StringType, false).add("n", DataTypes.LongType, false);
  static final UnsafeProjection KEYS = UnsafeProjection.create(KEY);
  static final UnsafeProjection PKEYS = UnsafeProjection.create(PKEY);
  static final UnsafeProjection PREFIXES = UnsafeProjection.create(PREFIX);
  static final UnsafeProjection VALUES = UnsafeProjection.create(VALUE);
  static final int MAX_PARALLELISM = 4;
  /** Keys per store in {@link #budget}; a prefix-scan store's are 100 prefixes of 8 rows. */
  static final int KEYS_PER_STORE = 800;
  /** The budget of {@link #budget} (bytes). */
  static final long LIMIT = Long.getLong("probe.budget", 256 << 10);

  /** One store and its model: key text → value text. */
  static final class Store {
    final StateMap map;
    final boolean prefixed;
    final Map<String, String> model = new HashMap<>();
    int damaged;

    Store(Engine engine, boolean prefixed) {
      this.prefixed = prefixed;
      StructType schema = prefixed ? PKEY : KEY;
      KeyHasher hasher = new KeyHasher(schema, KeyHasher.hashFieldCount(schema, prefixed ? 1 : 0, "default"),
          MAX_PARALLELISM);
      this.map = engine.newStore(new StoreSpec(schema, VALUE.fields().length, prefixed ? 1 : 0,
          KeyOrder.of(hasher::hash, hasher::keyGroup), e -> damaged++), 0);
    }

    LayeredMap layered() {
      return (LayeredMap) map;
    }

    /** The store's i-th key as text: "k<i>", or "p<i % 100>/<i / 100>". */
    String keyText(int i) {
      return prefixed ? "p" + (i % 100) + "/" + (i / 100) : "k" + i;
    }

    UnsafeRow key(String text) {
      if (!prefixed) {
        return KEYS.apply(new GenericInternalRow(new Object[] {UTF8String.fromString(text)})).copy();
      }
      String[] ps = text.split("/");
      return PKEYS.apply(new GenericInternalRow(new Object[] {UTF8String.fromString(ps[0]), Integer.parseInt(ps[1])}))
          .copy();
    }

    String keyOf(UnsafeRow key) {
      return prefixed ? key.getUTF8String(0) + "/" + key.getInt(1) : key.getUTF8String(0).toString();
    }

    /** Every row of the store against the model: null, or what differs. */
    String check() {
      Map<String, String> seen = new HashMap<>();
      Iterator<UnsafeRowPair> it = map.iterator();
      while (it.hasNext()) {
        UnsafeRowPair p = it.next();
        if (seen.put(keyOf(p.key()), show(p.value())) != null) {
          return "key " + keyOf(p.key()) + " visited twice";
        }
      }
      if (!seen.equals(model)) {
        return "the rows differ from the model: " + seen.size() + " rows, " + model.size() + " in the model";
      }
      if (map.size() != model.size()) {
        return "size() says " + map.size() + ", the model holds " + model.size();
      }
      return null;
    }
  }

  static UnsafeRow value(String text) {
    UTF8String s = UTF8String.fromString(text);
    return VALUES.apply(new GenericInternalRow(new Object[] {s, (long) s.numBytes()})).copy();
  }

  static UnsafeRow prefix(String p) {
    return PREFIXES.apply(new GenericInternalRow(new Object[] {UTF8String.fromString(p)})).copy();
  }

  static String show(UnsafeRow value) {
    if (value == null) {
      return null;
    }
    if (value.getLong(1) != value.getUTF8String(0).numBytes()) {
      return "CORRUPT";
    }
    return value.getUTF8String(0).toString();
  }

  static String valueText(Random rnd, int op) {
    int n = 16 + rnd.nextInt(rnd.nextInt(8) == 0 ? 900 : 200);
    StringBuilder sb = new StringBuilder("v").append(op).append('-');
    while (sb.length() < n) {
      sb.append((char) ('a' + rnd.nextInt(26)));
    }
    return sb.toString();
  }

  static int recordBytes(UnsafeRow key, UnsafeRow value) {
    return (8 + key.getSizeInBytes() + value.getSizeInBytes() + 7) & ~7;
  }

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, false, "UTF-8");
    String line;
    while ((line = in.readLine()) != null) {
      String[] a = line.split(" ");
      String answer;
      try {
        switch (a[0]) {
          case "budget":
            answer = budget(Long.parseLong(a[1]), Integer.parseInt(a[2]), Integer.parseInt(a[3]));
            break;
          case "release":
            answer = release();
            break;
          case "damage":
            answer = damage(a[1]);
            break;
          case "vanish":
            answer = vanish();
            break;
          case "forgotten":
            answer = forgotten(a[1]);
            break;
          case "pinned":
            answer = pinned(Long.parseLong(a[1]));
            break;
          case "filters":
            answer = filters();
            break;
          case "local":   // this JVM's local folder, made (leftovers of killed executors deleted) at first use
            LocalDirectory.newSpillFile();
            answer = "OK " + LocalDirectory.get().dir;
            break;
          default:
            answer = "ERR unknown command " + a[0];
        }
      } catch (Throwable t) {
        answer = "BAD " + t;
        t.printStackTrace();
      }
      out.println(answer.replace('\n', ' '));
      out.flush();
    }
  }

  // ------------------------------------------------------------------ budget

  static MemoryBudget budget;
  static Engine engine;
  static Store[] stores;

  /**
   * {@code STORES} stores (the last a prefix-scan one) on one engine whose budget is {@link #LIMIT}, each of
   * {@link #KEYS_PER_STORE} keys of values up to 1 KB (several times the budget together), driven by {@code OPS}
   * random operations: puts and removes, gets (they fill the block cache), prefix scans, now and then a whole
   * iteration, every store's batch ending every 500 operations. Every read is checked against the store's
   * model. After each operation the budget's use is noted; at the end, after every batch ended and the merges
   * settled, each kind of reservation is compared with what its holders hold. Answers
   * {@code OK limit maxUsed maxRecord spills merges maxCache maxRuns maxRows rows heldRows runs heldRuns cache
   * heldCache used maxPrefixIndex}; the prefix-scan store's index is checked against its entries at every batch end.
   */
  static String budget(long seed, int ops, int storeCount) throws Exception {
    budget = new MemoryBudget(LIMIT);
    engine = new Engine(budget);
    stores = new Store[storeCount];
    for (int i = 0; i < storeCount; i++) {
      stores[i] = new Store(engine, i == storeCount - 1);
    }
    Random rnd = new Random(seed);
    long maxUsed = 0;
    long maxCache = 0;
    long maxRuns = 0;
    long maxRows = 0;
    long maxIndex = 0;
    int maxRecord = 0;
    for (int op = 0; op < ops; op++) {
      Store s = stores[rnd.nextInt(storeCount)];
      String k = s.keyText(rnd.nextInt(KEYS_PER_STORE));
      int kind = rnd.nextInt(100);
      if (kind < 55) {
        String v = valueText(rnd, op);
        UnsafeRow key = s.key(k);
        UnsafeRow value = value(v);
        maxRecord = Math.max(maxRecord, recordBytes(key, value));
        s.map.put(key, value);
        s.model.put(k, v);
      } else if (kind < 65) {
        s.map.remove(s.key(k));
        s.model.remove(k);
      } else if (kind < 95 || !s.prefixed && kind < 99) {
        String got = show(s.map.get(s.key(k)));
        String want = s.model.get(k);
        if (want == null ? got != null : !want.equals(got)) {
          return "BAD get " + k + " answered " + got + ", the model holds " + want;
        }
      } else if (kind < 99) {
        String p = k.split("/")[0];
        Map<String, String> got = new TreeMap<>();
        Iterator<UnsafeRowPair> it = s.map.prefixScan(prefix(p));
        while (it.hasNext()) {
          UnsafeRowPair r = it.next();
          if (got.put(s.keyOf(r.key()), show(r.value())) != null) {
            return "BAD a prefix scan of " + p + " gave a key twice";
          }
        }
        Map<String, String> want = new TreeMap<>();
        s.model.forEach((key, v) -> {
          if (key.startsWith(p + "/")) {
            want.put(key, v);
          }
        });
        if (!got.equals(want)) {
          return "BAD a prefix scan of " + p + " gave " + got.keySet() + ", the model holds " + want.keySet();
        }
      } else {
        String bad = s.check();
        if (bad != null) {
          return "BAD " + bad;
        }
      }
      if ((op + 1) % 500 == 0) {
        for (Store t : stores) {
          if (t.prefixed) {
            long[] ix = prefixIndex(t);
            if (ix[0] != ix[1]) {
              return "BAD the prefix index reports " + ix[0] + " bytes, its entries take " + ix[1];
            }
            maxIndex = Math.max(maxIndex, ix[0]);
          }
          t.map.endBatch();
        }
      }
      maxUsed = Math.max(maxUsed, budget.used());
      maxCache = Math.max(maxCache, budget.used("cache"));
      maxRuns = Math.max(maxRuns, budget.used("runs"));
      maxRows = Math.max(maxRows, budget.used("rows"));
    }
    for (Store t : stores) {
      t.map.endBatch();
    }
    long spills = 0;
    long merges = 0;
    for (Store t : stores) {
      if (!t.layered().awaitMerges(60_000)) {
        return "BAD the merges did not settle in 60 s";
      }
      spills += t.map.stats().spills();
      merges += t.map.stats().merges();
      String bad = t.check();
      if (bad != null) {
        return "BAD " + bad;
      }
    }
    long[] held = held();
    return "OK " + LIMIT + " " + maxUsed + " " + maxRecord + " " + spills + " " + merges + " " + maxCache + " "
        + maxRuns + " " + maxRows + " " + budget.used("rows") + " " + held[0] + " " + budget.used("runs") + " "
        + held[1] + " " + budget.used("cache") + " " + held[2] + " " + budget.used() + " " + maxIndex;
  }

  /** What the holders hold now: the stores' heap rows, their runs' indexes and filters, the cache's blocks. */
  static long[] held() {
    long rows = 0;
    long runs = 0;
    for (Store t : stores) {
      if (t != null) {
        long heap = t.layered().overlayBytesNow();
        rows += heap;
        runs += t.map.bytes() - heap;
      }
    }
    return new long[] {rows, runs, engine.cache().usedBytes()};
  }

  /**
   * A prefix-scan store's index: the bytes it reports, and the bytes its entries take by its own measure
   * ({@link PrefixIndex#ENTRY_OVERHEAD} and the row per prefix and per key), counted here.
   */
  @SuppressWarnings("unchecked")
  static long[] prefixIndex(Store s) throws Exception {
    Field f = LayeredMap.class.getDeclaredField("prefixes");
    f.setAccessible(true);
    PrefixIndex index = (PrefixIndex) f.get(s.map);
    Field m = PrefixIndex.class.getDeclaredField("index");
    m.setAccessible(true);
    long counted = 0;
    for (Map.Entry<UnsafeRow, Set<UnsafeRow>> e : ((Map<UnsafeRow, Set<UnsafeRow>>) m.get(index)).entrySet()) {
      counted += PrefixIndex.ENTRY_OVERHEAD + e.getKey().getSizeInBytes();
      for (UnsafeRow k : e.getValue()) {
        counted += PrefixIndex.ENTRY_OVERHEAD + k.getSizeInBytes();
      }
    }
    return new long[] {index.bytes(), counted};
  }

  /**
   * After {@link #budget}: the first store is closed, the second read (its runs' blocks cached), iterated
   * partway and dropped without closing (a version nobody closed) and collected, then the rest closed. Answers {@code OK} and, after each step, the budget's
   * rows, runs, cache and total, and what the remaining stores hold (rows, runs): {@code closed: ...
   * dropped: ... all: ... open: runs}, runs the spill runs still open once every store is gone.
   */
  static String release() throws Exception {
    StringBuilder sb = new StringBuilder("OK");
    stores[0].map.close();
    stores[0] = null;
    sb.append(" closed: ").append(figures());
    for (String k : stores[1].model.keySet()) {   // its runs' blocks in the cache: collected, it must let them go
      stores[1].map.get(stores[1].key(k));
    }
    Iterator<UnsafeRowPair> partway = stores[1].map.iterator();   // an iteration never finished holds its runs
    for (int i = 0; i < 10 && partway.hasNext(); i++) {
      partway.next();
    }
    partway = null;
    stores[1] = null;
    long[] want = held();
    for (int i = 0; i < 300 && (budget.used("rows") != want[0] || budget.used("runs") != want[1]); i++) {
      System.gc();
      Thread.sleep(100);
    }
    sb.append(" dropped: ").append(figures());
    for (int i = 2; i < stores.length; i++) {
      stores[i].map.close();
      stores[i] = null;
    }
    sb.append(" all: ").append(figures());
    sb.append(" open: ").append(openRuns().size());
    return sb.toString();
  }

  static String figures() {
    long[] h = held();
    return budget.used("rows") + " " + budget.used("runs") + " " + budget.used("cache") + " " + budget.used() + " "
        + h[0] + " " + h[1];
  }

  // ------------------------------------------------------------------ damaged and vanished local files

  /** The spill runs this JVM holds open: descriptor → the file's path (each unlinked: "(deleted)"). */
  static Map<Path, String> openRuns() throws Exception {
    Map<Path, String> runs = new TreeMap<>();
    try (Stream<Path> fds = Files.list(Paths.get("/proc/self/fd"))) {
      for (Path fd : (Iterable<Path>) fds::iterator) {
        String target;
        try {
          target = Files.readSymbolicLink(fd).toString();
        } catch (java.io.IOException e) {
          continue;   // the listing's own descriptor, closed by now
        }
        if (target.contains("/spill/state-") && target.endsWith(" (deleted)")) {
          runs.put(fd, target.substring(0, target.length() - " (deleted)".length()));
        }
      }
    }
    return runs;
  }

  /**
   * Two stores (a plain and a prefix-scan one, on a budget of 4 KiB: nothing stays cached) of 600 rows each
   * in runs on local disk, spilled over three batches and merged; then every open run is damaged through its
   * descriptor ({@code /proc/self/fd/N}: the files are unlinked): {@code flip} XORs every byte of its blocks
   * (the index intact, so only a block's CRC can tell), {@code truncate} cuts the file in half. Then every
   * key is looked up, every prefix scanned and each store iterated: each answer must be the model's, or a
   * {@link RowImageException} naming a damaged file; never another answer. Then both stores are closed. Answers
   * {@code OK files failedGets rightGets failedScans rightScans iterationsFailed onDamage leftBytes openRuns
   * message}: leftBytes the rows and runs still charged to the budget, openRuns the damaged runs still open.
   */
  static String damage(String mode) throws Exception {
    Engine e = new Engine(new MemoryBudget(4096));
    Store[] two = {new Store(e, false), new Store(e, true)};
    Random rnd = new Random(11);
    for (int batch = 0; batch < 3; batch++) {
      for (Store s : two) {
        for (int i = batch * 200; i < (batch + 1) * 200; i++) {
          String v = valueText(rnd, i);
          s.map.put(s.key(s.keyText(i)), value(v));
          s.model.put(s.keyText(i), v);
        }
        s.map.endBatch();
        s.layered().spill();
      }
    }
    for (Store s : two) {
      s.layered().awaitMerges(60_000);
      if (s.map.stats().diskRows() < s.model.size()) {
        return "BAD only " + s.map.stats().diskRows() + " of " + s.model.size() + " rows are in runs";
      }
    }
    Map<Path, String> runs = openRuns();
    if (runs.isEmpty()) {
      return "BAD no open run found under /proc/self/fd";
    }
    for (Path fd : runs.keySet()) {
      try (RandomAccessFile f = new RandomAccessFile(fd.toFile(), "rw")) {
        long size = f.length();
        if (mode.equals("truncate")) {
          f.setLength(size / 2);
          continue;
        }
        byte[] trailer = new byte[RowImage.TRAILER_BYTES];
        f.seek(size - trailer.length);
        f.readFully(trailer);
        long blocksEnd = ByteBuffer.wrap(trailer).order(ByteOrder.LITTLE_ENDIAN).getLong(0);
        byte[] blocks = new byte[(int) blocksEnd];
        f.seek(0);
        f.readFully(blocks);
        for (int i = 0; i < blocks.length; i++) {
          blocks[i] ^= 0x5A;
        }
        f.seek(0);
        f.write(blocks);
      }
    }
    int failedGets = 0;
    int rightGets = 0;
    int failedScans = 0;
    int rightScans = 0;
    int iterationsFailed = 0;
    String message = null;
    for (Store s : two) {
      for (int i = 0; i < KEYS_PER_STORE; i++) {   // 600 keys held, 200 never
        String k = s.keyText(i);
        try {
          String got = show(s.map.get(s.key(k)));
          String want = s.model.get(k);
          if (want == null ? got != null : !want.equals(got)) {
            return "BAD get " + k + " answered " + got + " over a damaged run; the model holds " + want;
          }
          rightGets++;
        } catch (RowImageException x) {
          String bad = namesADamagedRun(x, runs);
          if (bad != null) {
            return bad;
          }
          failedGets++;
          message = message == null ? x.getMessage() : message;
        }
      }
      if (s.prefixed) {
        for (int p = 0; p < 100; p++) {
          try {
            int n = 0;
            Iterator<UnsafeRowPair> it = s.map.prefixScan(prefix("p" + p));
            while (it.hasNext()) {
              UnsafeRowPair r = it.next();
              String want = s.model.get(s.keyOf(r.key()));
              if (want == null || !want.equals(show(r.value()))) {
                return "BAD a prefix scan over a damaged run gave " + s.keyOf(r.key()) + " = " + show(r.value());
              }
              n++;
            }
            if (n != 6) {
              return "BAD a prefix scan over a damaged run gave " + n + " of the 6 rows of p" + p;
            }
            rightScans++;
          } catch (RowImageException x) {
            String bad = namesADamagedRun(x, runs);
            if (bad != null) {
              return bad;
            }
            failedScans++;
          }
        }
      }
      try {
        String bad = s.check();
        if (bad != null) {
          return "BAD an iteration over a damaged run: " + bad;
        }
      } catch (RowImageException x) {
        String bad = namesADamagedRun(x, runs);
        if (bad != null) {
          return bad;
        }
        iterationsFailed++;
      }
    }
    int onDamage = two[0].damaged + two[1].damaged;
    for (Store s : two) {
      s.map.close();
    }
    long left = e.budget().used("rows") + e.budget().used("runs");
    int open = 0;
    for (String file : openRuns().values()) {
      open += runs.containsValue(file) ? 1 : 0;
    }
    return "OK " + runs.size() + " " + failedGets + " " + rightGets + " " + failedScans + " " + rightScans + " "
        + iterationsFailed + " " + onDamage + " " + left + " " + open + " " + message;
  }

  /** Null if the exception names one of the damaged files, else what is wrong. */
  static String namesADamagedRun(RowImageException x, Map<Path, String> runs) {
    for (String file : runs.values()) {
      if (x.getMessage().contains(file)) {
        return null;
      }
    }
    return "BAD a RowImageException that names none of the damaged runs " + runs.values() + ": " + x.getMessage();
  }

  /**
   * The spill directory deleted under a store (a disk cleaner): the runs already open are read through their
   * descriptors, and the next spills and merges make the directory again. Two rounds of 300 rows, each
   * spilled, the directory deleted after each; every row must be there. Answers {@code OK spills runs}.
   */
  static String vanish() throws Exception {
    Engine e = new Engine(new MemoryBudget(4096));
    Store s = new Store(e, false);
    Random rnd = new Random(5);
    for (int round = 0; round < 4; round++) {
      for (int i = 0; i < 300; i++) {
        String k = s.keyText(rnd.nextInt(KEYS_PER_STORE));
        String v = valueText(rnd, i);
        s.map.put(s.key(k), value(v));
        s.model.put(k, v);
      }
      s.map.endBatch();
      s.layered().spill();
      s.layered().awaitMerges(60_000);
      try (Stream<Path> files = Files.walk(LocalDirectory.get().spill())) {
        files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
      }
      if (Files.exists(LocalDirectory.get().spill())) {
        return "BAD the spill directory could not be deleted";
      }
    }
    for (Map.Entry<String, String> r : s.model.entrySet()) {
      if (!r.getValue().equals(show(s.map.get(s.key(r.getKey()))))) {
        return "BAD " + r.getKey() + " lost after its spill directory vanished";
      }
    }
    String bad = s.check();
    if (bad != null) {
      return "BAD " + bad;
    }
    LocalStats stats = s.map.stats();
    s.map.close();
    return "OK " + stats.spills() + " " + stats.runs();
  }

  // ------------------------------------------------------------------ iterators outliving their batch

  /**
   * An iterator of a store whose rows are half on the heap, half in runs, read one row, then the store is
   * closed ({@code close}: a version dropped) or its batch ends ({@code batch}: the iterator forgotten), and
   * the iterator read on. It must go on giving every row, or fail loudly: never end early, as if the rows it
   * can no longer read did not exist. Answers {@code OK rows of total} when it ended, {@code THREW message}.
   */
  static String forgotten(String when) throws Exception {
    Engine e = new Engine(new MemoryBudget(1L << 30));
    Store s = new Store(e, false);
    for (int i = 0; i < 400; i++) {
      s.map.put(s.key(s.keyText(i)), value("v" + i));
      if (i == 199) {
        s.map.endBatch();
        s.layered().spill();
      }
    }
    Iterator<UnsafeRowPair> it = s.map.iterator();
    it.next();
    if (when.equals("close")) {
      s.map.close();
    } else {
      s.map.endBatch();
    }
    int n = 1;
    try {
      while (it.hasNext()) {
        it.next();
        n++;
      }
    } catch (IllegalStateException x) {
      return "THREW " + x.getMessage();
    } finally {
      s.map.close();
    }
    return "OK " + n + " of 400";
  }

  // ------------------------------------------------------------------ filters

  /**
   * What an absent key costs: a store of 2,000 keys spilled over four batches into runs (a 4 KiB budget: the
   * cache keeps next to nothing, so a lookup that needs a block reads it), merges settled; then 2,000 keys it
   * never held are looked up and removed (nothing changes: the runs stay), 2,000 new keys are put (and settled),
   * and 200 keys it holds are looked up. Answers {@code OK runs absentLoads absentPuts putLoads presentGets
   * presentLoads}: the block reads (the cache's loads) of the gets and removes, of the puts (absentPuts of them
   * answered ABSENT: no filter let the key through), and of the gets of held keys. Every answer is checked.
   */
  static String filters() throws Exception {
    Engine e = new Engine(new MemoryBudget(4096));
    Store s = new Store(e, false);
    Random rnd = new Random(3);
    for (int batch = 0; batch < 4; batch++) {
      for (int i = batch * 500; i < (batch + 1) * 500; i++) {
        String v = valueText(rnd, i);
        s.map.put(s.key("k" + i), value(v));
        s.model.put("k" + i, v);
      }
      s.map.endBatch();
      s.layered().spill();
    }
    if (!s.layered().awaitMerges(60_000)) {
      return "BAD the merges did not settle in 60 s";
    }
    s.map.endBatch();
    int runs = s.map.stats().runs();
    if (s.map.stats().diskRows() < 2000 || s.map.stats().heapBytes() > 1024) {   // an empty heap's table aside
      return "BAD the rows are not all in runs: " + s.map.stats();
    }
    long before = e.cache().loads();
    for (int i = 0; i < 2000; i++) {   // no change: nothing spills, the runs stay as they are
      UnsafeRow key = s.key("absent" + i);
      if (s.map.get(key) != null) {
        return "BAD get of an absent key answered a value";
      }
      if (s.map.remove(key) != StateMap.ABSENT) {
        return "BAD remove of an absent key did not answer ABSENT";
      }
    }
    long absentLoads = e.cache().loads() - before;
    before = e.cache().loads();
    int absentPuts = 0;
    for (int i = 0; i < 2000; i++) {
      int put = s.map.put(s.key("new" + i), value("x"));
      if (put != StateMap.ABSENT && put != StateMap.UNCHANGED) {   // UNCHANGED: a filter let it through
        return "BAD put of a new key answered " + put;
      }
      absentPuts += put == StateMap.ABSENT ? 1 : 0;
      s.model.put("new" + i, "x");
    }
    s.map.size();   // settles the keys a filter let through
    long putLoads = e.cache().loads() - before;
    before = e.cache().loads();
    for (int i = 0; i < 2000; i += 10) {
      String k = "k" + i;
      if (!s.model.get(k).equals(show(s.map.get(s.key(k))))) {
        return "BAD get " + k + " answered the wrong value";
      }
    }
    long presentLoads = e.cache().loads() - before;
    s.map.endBatch();
    String bad = s.check();
    s.map.close();
    if (bad != null) {
      return "BAD " + bad;
    }
    return "OK " + runs + " " + absentLoads + " " + absentPuts + " " + putLoads + " 200 " + presentLoads;
  }

  // ------------------------------------------------------------------ pinned

  /**
   * A store of 2,000 keys put over four batches, each spilled into a run, on a budget of {@code limit} bytes.
   * Answers {@code OK pinnedBytes limit warnedBefore}: what the runs' indexes and filters hold once the runs are
   * written (no spill gives it back), and whether the budget had already said
   * so (a later {@link MemoryBudget#warnPinned} does not log again).
   */
  static String pinned(long limit) throws Exception {
    MemoryBudget b = new MemoryBudget(limit);
    Engine e = new Engine(b);
    Store s = new Store(e, false);
    Random rnd = new Random(5);
    for (int batch = 0; batch < 4; batch++) {
      for (int i = batch * 500; i < (batch + 1) * 500; i++) {
        s.map.put(s.key("k" + i), value(valueText(rnd, i)));
      }
      s.map.endBatch();
      s.layered().spill();
    }
    for (int i = 0; i < 64; i++) {   // puts after the runs: the store looks at the budget every few of them
      s.map.put(s.key("late" + i), value("x"));
    }
    long pinned = b.used("runs");
    boolean warnedBefore = !b.warnPinned("probe");
    s.map.close();
    return "OK " + pinned + " " + limit + " " + warnedBefore;
  }
}
