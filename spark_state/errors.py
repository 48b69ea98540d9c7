"""Errors the plugin raises. Each message says what was wrong and how to fix it.

The worker sends ``type(err).__name__`` as the error kind to the JVM shim, so
these names are part of the protocol (docs/protocol.md).
"""

from spark_state.options import OptionError


class SparkStateError(Exception):
    """Base of every error of the plugin."""


class VersionNotFound(SparkStateError):
    """A version asked for is not in the checkpoint storage."""


class ChecksumMismatch(SparkStateError):
    """A file's bytes do not match the checksum its manifest recorded."""


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


class StoreDeleted(StorageError):
    """A store's directory was deleted while background work (compaction) wanted to write into it."""


class StaleState(SparkStateError):
    """A commit built on a version that storage no longer holds (another task attempt re-committed it)."""


class ProtocolError(SparkStateError):
    """A malformed request between the JVM shim and the worker."""


__all__ = [
    "SparkStateError", "OptionError", "VersionNotFound", "ChecksumMismatch",
    "StateTooLarge", "StateLost", "MaxParallelismChanged", "FormatVersionError",
    "StorageError", "StoreDeleted", "StaleState", "ProtocolError",
]
