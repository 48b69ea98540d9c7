"""The chaos soak (issue 27): hours of faults on two executors and object storage, nothing lost.

A standalone master and two one-core workers on loopback run four concurrent queries (an
aggregation, applyInPandasWithState with event-time timeouts, dropDuplicates with a watermark,
a stream-stream join) whose state spark_state keeps on an S3 server on loopback, reached through
a fault-injecting proxy. Input arrives continuously while a seeded schedule fires faults
(faults.py). At the end every output and every stored state must equal a plain-Python model's,
every retained version must load, ``spark-state validate`` must be clean, no orphan file may
outlive the grace period and memory must not grow without bound.

    python -m benchmarks.soak --minutes 60            # make soak MINUTES=60
    python -m benchmarks.soak --report-only           # rebuild results.md/json and soak.png

Modules: cluster (the world), proxy (S3 faults), inputs (ticks of input), queries, faults
(schedule and injectors), samples, model, checks, run (the loop), report.
"""
