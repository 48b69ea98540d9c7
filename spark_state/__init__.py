"""spark_state: Flink-style key-group snapshots as a Spark Structured Streaming state store."""

__version__ = "0.1.0"

#: The Java class Spark instantiates (spark.sql.streaming.stateStore.providerClass).
PROVIDER_CLASS = "io.sparkstate.shim.SparkStateProvider"
