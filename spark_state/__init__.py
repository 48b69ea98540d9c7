"""spark_state: Flink-style key-group snapshots as a Spark Structured Streaming state store.

Turn it on with ``spark_state.configure(SparkSession.builder)``; see README.md.
"""

__version__ = "0.1.0"

#: The Java class Spark instantiates (spark.sql.streaming.stateStore.providerClass).
PROVIDER_CLASS = "io.sparkstate.shim.SparkStateProvider"


def configure(builder, **options):
    """Returns the builder with spark_state as the state store; see spark_state.spark_config."""
    from spark_state.spark_config import configure as _configure

    return _configure(builder, **options)


def shim_jar(build: bool = True):
    """Path of the JVM shim jar for the installed Spark, built with javac if needed."""
    from spark_state.shim import shim_jar as _shim_jar

    return _shim_jar(build=build)


__all__ = ["PROVIDER_CLASS", "configure", "shim_jar", "__version__"]
