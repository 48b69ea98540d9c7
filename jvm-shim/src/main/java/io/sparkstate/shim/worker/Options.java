package io.sparkstate.shim.worker;

import java.util.Collections;
import java.util.Map;
import java.util.TreeMap;

import io.sparkstate.shim.codec.KeyHasher;

/**
 * The plugin's options as the shim reads them: every conf under {@link #PREFIX}, prefix stripped,
 * values as strings. The worker defines, defaults and validates them ({@code spark_state/options.py};
 * tests/test_java_python_contract.py checks the constants both sides share); the shim sends them
 * with every request and reads the few it needs itself.
 */
public final class Options {
  static final String PREFIX = "spark.sql.streaming.stateStore.sparkState.";
  static final String MAX_PARALLELISM = "maxParallelism";
  static final String PYTHON = "python";
  static final String PRESTART_WORKER = "prestartWorker";
  static final int DEFAULT_MAX_PARALLELISM = KeyHasher.DEFAULT_MAX_PARALLELISM;

  private final Map<String, String> values;

  private Options(Map<String, String> values) {
    this.values = Collections.unmodifiableMap(values);
  }

  /** The options among Spark conf entries (full keys). */
  public static Options from(Map<String, String> conf) {
    Map<String, String> values = new TreeMap<>();
    for (Map.Entry<String, String> e : conf.entrySet()) {
      if (e.getKey().startsWith(PREFIX)) {
        values.put(e.getKey().substring(PREFIX.length()), e.getValue());
      }
    }
    return new Options(values);
  }

  /** Short option name → value, as requests send them. */
  Map<String, String> asMap() {
    return values;
  }

  /** The number of key groups; call after the worker validated the options (it reports bad values). */
  public int maxParallelism() {
    String raw = values.get(MAX_PARALLELISM);
    if (raw == null) {
      return DEFAULT_MAX_PARALLELISM;
    }
    try {
      int m = Integer.parseInt(raw.trim());
      if (m > 0) {
        return m;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw new IllegalArgumentException("spark_state: " + PREFIX + MAX_PARALLELISM + "=" + raw
        + " is not a positive whole number.");
  }

  /** The Python the option names to run the worker, or null. */
  String python() {
    String v = values.get(PYTHON);
    return v == null || v.trim().isEmpty() ? null : v.trim();
  }

  /** Whether the executor plugin starts the worker when the executor starts (default true). */
  public boolean prestartWorker() {
    return Boolean.parseBoolean(values.getOrDefault(PRESTART_WORKER, "true").trim());
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof Options && values.equals(((Options) o).values);
  }

  @Override
  public int hashCode() {
    return values.hashCode();
  }
}
