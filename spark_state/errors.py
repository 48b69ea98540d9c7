"""Every error spark_state raises. Each message says what was wrong and how to fix it.

The worker sends ``type(err).__name__`` as the error kind to the JVM shim, so
these names are part of the protocol (docs/protocol.md): rename none of them.
This module imports nothing, so every other module (and setup.py, through
``spark_state.spark.shim``) can use it.
"""


class SparkStateError(Exception):
    """Base of every error of the plugin."""


class OptionError(SparkStateError, ValueError):
    """An option value the plugin cannot use; the message says which and how to fix it."""


class VersionNotFound(SparkStateError):
    """A version asked for is not in the checkpoint storage."""


class ChecksumMismatch(SparkStateError):
    """A file's bytes do not match the checksum its manifest recorded (or a record is not valid JSON)."""


class StateTooLarge(SparkStateError):
    """A snapshot exceeds the memory storage's per-snapshot limit."""


class StateLost(VersionNotFound):
    """A version Spark committed whose data lived only in an ended process (memory storage)."""


class MaxParallelismChanged(SparkStateError):
    """A restore asked for another max parallelism than the checkpoint was written with."""


class FormatVersionError(SparkStateError):
    """A manifest or file was written by a newer format version than this one reads."""


class StorageError(SparkStateError):
    """A storage URL or backend the plugin cannot use."""


class FileMissing(StorageError):
    """A data file a manifest names is not in the checkpoint storage (something outside spark_state deleted it)."""


class StoreDeleted(StorageError):
    """A store's directory was deleted while background work (compaction) wanted to write into it."""


class StaleState(SparkStateError):
    """A commit built on a version that storage no longer holds (another task attempt re-committed it)."""


class HistoryUnavailable(SparkStateError):
    """Changes asked for are no longer recorded (retention dropped them, or a version was written whole)."""


class ProtocolError(SparkStateError):
    """A malformed request between the JVM shim and the worker."""


class StreamLost(SparkStateError):
    """The changes a shim streamed for a commit are not in this worker (it was restarted, or the stream expired
    or was dropped); the shim sends them again."""


class CheckpointError(SparkStateError):
    """A Spark checkpoint directory the tools cannot use as asked; the message says why and what to do."""


class ShimBuildError(SparkStateError, RuntimeError):
    """The shim jar cannot be built; the message says why and how to fix it."""


class UnsupportedSparkVersion(ShimBuildError):
    """The installed pyspark is not one the shim supports."""


class ShimNotLoaded(SparkStateError, RuntimeError):
    """The running Spark driver cannot load the spark_state provider class."""


__all__ = [
    "SparkStateError", "OptionError", "VersionNotFound", "ChecksumMismatch",
    "StateTooLarge", "StateLost", "MaxParallelismChanged", "FormatVersionError",
    "StorageError", "StoreDeleted", "StaleState", "ProtocolError", "CheckpointError",
    "ShimBuildError", "UnsupportedSparkVersion", "ShimNotLoaded",
]
