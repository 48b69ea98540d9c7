package io.sparkstate.shim;

import java.util.HashMap;
import java.util.Map;

import io.sparkstate.shim.codec.TypedCodec;
import io.sparkstate.shim.engine.Engine;
import io.sparkstate.shim.worker.Options;
import io.sparkstate.shim.worker.StoreClient;
import io.sparkstate.shim.worker.WorkerClient;
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
 * start; then loads the JVM classes of the Arrow conversion ({@link TypedCodec#warmUp}) and runs one restore
 * of a small image of its own ({@link Engine#warmUp}). Without it the worker starts at the first store, inside
 * that task. Turned off with
 * {@code spark.sql.streaming.stateStore.sparkState.prestartWorker=false}.
 */
public class SparkStatePlugin implements SparkPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(SparkStatePlugin.class);
  /**
   * How long an executor that shuts down waits for its worker's background work: the compactions and row
   * images of the last batches, which a restart reads instead of decoding rows. What is left then is done
   * by the next maintenance or restart; nothing is lost either way.
   */
  static final long DRAIN_TIMEOUT_MS = Long.getLong("spark_state.drainTimeoutMs", 120_000);

  @Override
  public DriverPlugin driverPlugin() {
    return null;
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ExecutorPlugin() {
      private Options options;

      @Override
      public void shutdown() {
        if (options == null) {
          return;
        }
        long t0 = System.nanoTime();
        try {
          long left = WorkerClient.get().drain(options, DRAIN_TIMEOUT_MS);
          long ms = (System.nanoTime() - t0) / 1_000_000L;
          if (left > 0) {
            LOG.warn("spark_state: the executor stops with {} background job(s) of its state worker unfinished after "
                + "{} ms (compactions, row images): the next restart decodes those rows instead", left, ms);
          } else if (ms > 1000) {
            LOG.info("spark_state: waited {} ms for the state worker's background work before stopping", ms);
          }
        } catch (RuntimeException e) {
          LOG.warn("spark_state: could not wait for the state worker's background work: {}", e.toString());
        }
      }

      @Override
      public void init(PluginContext ctx, Map<String, String> extraConf) {
        Options options = options(ctx.conf());
        this.options = options;
        if (!options.prestartWorker()) {
          return;
        }
        Thread t = new Thread(() -> {
          boolean started = false;
          try {
            WorkerClient.get().prestart(options);
            started = true;
          } catch (RuntimeException e) {
            // Not fatal: the first state store starts the worker (and reports the failure) as without the plugin.
            LOG.warn("spark_state: could not start the state worker ahead of the first task: {}", e.toString());
          }
          if (started) {
            try {
              // the options of the Spark conf, checked as a store's are: with a remote checkpointRoot the worker
              // sets up that storage's backend now (s3fs: ~0.4 s), not in the first restore
              StoreClient.validate(WorkerClient.get(), options);
            } catch (RuntimeException e) {
              LOG.info("spark_state: the options in the Spark conf did not validate ahead of the first task (the "
                  + "first store reports it): {}", e.toString());
            }
          }
          try {
            TypedCodec.warmUp();
          } catch (Exception | LinkageError e) {
            LOG.info("spark_state: warming up the Arrow conversion failed (the first store pays for it): {}",
                e.toString());
          }
          try {
            long t0 = System.nanoTime();
            Engine.executor().warmUp();
            LOG.info("spark_state: restore path warmed up ahead of the first task ({} ms)",
                (System.nanoTime() - t0) / 1_000_000L);
          } catch (Exception | LinkageError e) {
            LOG.info("spark_state: warming up the restore path failed (the first restore pays for it): {}",
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
