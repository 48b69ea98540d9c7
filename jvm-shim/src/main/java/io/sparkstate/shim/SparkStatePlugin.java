package io.sparkstate.shim;

import io.sparkstate.shim.codec.TypedCodec;
import io.sparkstate.shim.worker.Options;
import io.sparkstate.shim.worker.WorkerClient;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.SparkConf;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Tuple2;

/**
 * Starts the executor's state worker when the executor starts ({@code spark.plugins}), in the
 * background, so the first task that opens a state store does not wait for Python and pyarrow to
 * start; then loads the JVM classes of the Arrow conversion ({@link TypedCodec#warmUp}). Without it
 * the worker starts at the first store, inside that task. Turned off with
 * {@code spark.sql.streaming.stateStore.sparkState.prestartWorker=false}.
 */
public class SparkStatePlugin implements SparkPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(SparkStatePlugin.class);

  @Override
  public DriverPlugin driverPlugin() {
    return null;
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ExecutorPlugin() {
      @Override
      public void init(PluginContext ctx, Map<String, String> extraConf) {
        Options options = options(ctx.conf());
        if (!options.prestartWorker()) {
          return;
        }
        Thread t = new Thread(() -> {
          try {
            WorkerClient.get().prestart(options);
          } catch (RuntimeException e) {
            // Not fatal: the first state store starts the worker (and reports the failure) as without the plugin.
            LOG.warn("spark_state: could not start the state worker ahead of the first task: {}", e.toString());
          }
          try {
            TypedCodec.warmUp();
          } catch (Exception | LinkageError e) {
            LOG.info("spark_state: warming up the Arrow conversion failed (the first store pays for it): {}",
                e.toString());
          }
        }, "spark-state-worker-prestart");
        t.setDaemon(true);
        t.start();
      }
    };
  }

  /** The plugin's options as the Spark conf holds them. */
  static Options options(SparkConf conf) {
    Map<String, String> all = new HashMap<>();
    for (Tuple2<String, String> e : conf.getAll()) {
      all.put(e._1(), e._2());
    }
    return Options.from(all);
  }
}
