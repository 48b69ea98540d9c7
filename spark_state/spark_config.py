"""One call to turn spark_state on for a SparkSession, in the style of delta-spark's helper."""

from __future__ import annotations

import sys
from typing import Any

from spark_state import PROVIDER_CLASS
from spark_state.options import PREFIX, Settings

_PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
_LISTENERS_KEY = "spark.sql.streaming.streamingQueryListeners"
#: Driver-side listener that logs a warning when stores report failing background maintenance.
MAINTENANCE_LISTENER = "io.sparkstate.shim.MaintenanceWarnings"

#: configure() keyword -> option short name, so Python callers can use snake_case.
KEYWORDS = {
    "storage": "storage",
    "checkpoint_root": "checkpointRoot",
    "max_parallelism": "maxParallelism",
    "compression_level": "compressionLevel",
    "snapshot_interval": "snapshotInterval",
    "memory_max_state_size": "memory.maxStateSize",
    "memory_metadata_dir": "memory.metadataDir",
    "python": "python",
    "verify_checksums": "verifyChecksums",
    "file_grace_period": "fileGracePeriod",
    "fsync": "fsync",
    "savepoint_dir": "savepointDir",
}


def option_conf(**options: Any) -> dict[str, str]:
    """The ``...sparkState.*`` conf entries for snake_case ``options``, validated (OptionError)."""
    unknown = sorted(set(options) - set(KEYWORDS))
    if unknown:
        raise TypeError(f"unknown spark_state option(s) {unknown}; known: {sorted(KEYWORDS)}")
    raw = {KEYWORDS[k]: ("true" if v is True else "false" if v is False else str(v))
           for k, v in options.items() if v is not None}
    Settings.from_conf(raw)  # raises OptionError with a clear message
    return {PREFIX + k: v for k, v in raw.items()}


def spark_conf(**options: Any) -> dict[str, str]:
    """Every Spark conf entry configure() sets, as a dict (for --conf lines or spark-defaults.conf).

    Values are validated here, so a bad value fails before Spark starts.
    """
    from spark_state.shim import shim_jar

    options.setdefault("python", sys.executable)
    conf = option_conf(**options)
    conf[_PROVIDER_KEY] = PROVIDER_CLASS
    conf[_LISTENERS_KEY] = MAINTENANCE_LISTENER
    conf["spark.jars"] = str(shim_jar())
    return conf


def configure(builder, **options: Any):
    """Returns ``builder`` with the shim jar on the classpath and spark_state as the state store.

    ``options`` are the plugin's options in snake_case (see ``spark_state.options``):
    ``configure(SparkSession.builder, storage="filesystem", snapshot_interval=5)``.
    A ``spark.jars`` value already on the builder is kept; the shim jar is appended.
    """
    conf = spark_conf(**options)
    for key in ("spark.jars", _LISTENERS_KEY):   # lists: keep what the builder already has
        existing = builder._options.get(key) if hasattr(builder, "_options") else None
        value = conf.pop(key)
        if existing and value not in existing.split(","):
            value = f"{existing},{value}"
        builder = builder.config(key, value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder
