"""spark_state: Flink-style key-group snapshots as a Spark Structured Streaming state store.

Turn it on with ``spark_state.configure(SparkSession.builder)``; see README.md and the user guide in docs/.
"""

__version__ = "0.2.0"

#: The Java class Spark instantiates (spark.sql.streaming.stateStore.providerClass).
PROVIDER_CLASS = "io.sparkstate.shim.SparkStateProvider"


def configure(builder, **options):
    """Returns the builder with spark_state as the state store; see spark_state.spark.config."""
    from spark_state.spark.config import configure as _configure

    return _configure(builder, **options)


def check_options(session):
    """Raises OptionError for a spark_state option of `session` (e.g. set with ``spark.conf.set``; or a mapping
    of Spark conf entries) that the first batch would refuse; see spark_state.spark.config."""
    from spark_state.spark.config import check_options as _check_options

    _check_options(session)


def shim_jar(build: bool = True):
    """Path of the JVM shim jar for the installed Spark, built with javac if needed."""
    from spark_state.spark.shim import shim_jar as _shim_jar

    return _shim_jar(build=build)


def rescale(checkpoint_location, num_partitions, **kwargs):
    """Changes a stopped query's partition count, writing metadata only; see spark_state.lifecycle.rescale."""
    from spark_state.lifecycle.rescale import rescale as _rescale

    return _rescale(checkpoint_location, num_partitions, **kwargs)


def savepoint(checkpoint_location, target=None, **kwargs):
    """A self-contained copy of a committed batch; see spark_state.lifecycle.savepoint."""
    from spark_state.lifecycle.savepoint import savepoint as _savepoint

    return _savepoint(checkpoint_location, target, **kwargs)


def restore(source, checkpoint_location, batch=None, **kwargs):
    """A new checkpoint that resumes after a batch of a savepoint or checkpoint; see spark_state.lifecycle.restore."""
    from spark_state.lifecycle.restore import restore as _restore

    return _restore(source, checkpoint_location, batch, **kwargs)


def migrate(checkpoint_location, target, to="spark_state", **kwargs):
    """A new checkpoint of a stopped query on spark_state or Spark's HDFS provider; see spark_state.lifecycle.migrate."""
    from spark_state.lifecycle.migrate import migrate as _migrate

    return _migrate(checkpoint_location, target, to, **kwargs)


def read_state(checkpoint_location, operator=0, store_name=None, batch=None, partitions=None, **kwargs):
    """One operator's state at a committed batch as a pyarrow Table, without Spark (spark_state.lifecycle.reading)."""
    from spark_state.lifecycle.reading import read_state as _read_state

    return _read_state(checkpoint_location, operator, store_name, batch, partitions, **kwargs)


def read_changes(checkpoint_location, operator=0, store_name=None, start_batch=0, end_batch=None, partitions=None,
                 **kwargs):
    """The changes each batch made to one operator's state as a pyarrow Table, without Spark
    (spark_state.lifecycle.reading)."""
    from spark_state.lifecycle.reading import read_changes as _read_changes

    return _read_changes(checkpoint_location, operator, store_name, start_batch, end_batch, partitions, **kwargs)


__all__ = ["PROVIDER_CLASS", "check_options", "configure", "migrate", "read_changes", "read_state", "rescale", "restore", "savepoint", "shim_jar", "__version__"]
