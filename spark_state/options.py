"""The plugin's options: names, defaults, validation.

Every option lives under one prefix, ``spark.sql.streaming.stateStore.sparkState.``,
because Spark hands every ``spark.sql.streaming.stateStore.*`` SQL setting to
the provider. This module is the one place they are defined; ``configure()``,
the worker and ``conf/spark-defaults.conf`` all follow it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping

from spark_state.errors import OptionError

PREFIX = "spark.sql.streaming.stateStore.sparkState."

#: Default max parallelism M (number of key groups). 100800 = 2^6 * 3^2 * 5^2 * 7,
#: so every partition count in 1-10, 12, 14, 15, 16, 18, 20, 24, 25, 28, 30, 32,
#: 35, 36, 40, 42, 45, 48, 50, 56, 60, 63, 64, 70, 72, 75, 80, 90, 96, 100, 112,
#: 120, 144, 150, 160, 175, 180, 192, 200, 224, 225, 240, 300, 320, 336, 350,
#: 400, 448, 450, 480, 525, 560, 576, 600, 700, 720, 800, 900, 960, 1008, 1200,
#: 1600 ... divides it and a rescale between any two of them reads whole key
#: groups by offset.
DEFAULT_MAX_PARALLELISM = 100_800
MAX_MAX_PARALLELISM = 2**31 - 1
DEFAULT_MEMORY_MAX_STATE_SIZE = 5 * 1024 * 1024
#: Snapshots with fewer rows get no row image: loading them whole takes about as long as opening one.
DEFAULT_ROW_IMAGES_MIN_ROWS = 100_000
#: Bytes from which ``rowImages.rangeReads=auto`` reads a remote row image by range (64 MiB, about 6M rows of
#: long keys and values): below it a download is faster for a batch that touches most blocks
#: (benchmarks/results/remote-restore/, docs/large-state.md).
DEFAULT_RANGE_READS_MIN_SIZE = 64 << 20

STORAGES = ("filesystem", "memory")


def _positive_int(name: str, raw: str, lo: int = 1, hi: int = MAX_MAX_PARALLELISM) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"{PREFIX}{name}={raw!r} is not a whole number; set it to an integer in [{lo}, {hi}].") from None
    if not lo <= value <= hi:
        raise OptionError(f"{PREFIX}{name}={value} is out of range; set it to an integer in [{lo}, {hi}].")
    return value


def _size(name: str, raw: str) -> int:
    """Accepts bytes or a size with a unit: 5m, 5mb, 5MiB, 512k, 1g."""
    text = str(raw).strip().lower().replace("ib", "").rstrip("b")
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    mult = 1
    if text and text[-1] in units:
        mult, text = units[text[-1]], text[:-1]
    try:
        value = int(float(text) * mult)
    except ValueError:
        raise OptionError(f"{PREFIX}{name}={raw!r} is not a size; use bytes or a unit, e.g. 5m or 64MiB.") from None
    if value <= 0:
        raise OptionError(f"{PREFIX}{name}={raw!r} must be positive; use e.g. 5m.")
    return value


def _duration(name: str, raw: str) -> float:
    """Seconds from '0', '30s', '5m', '1h', '250ms' or a bare number of seconds."""
    text = str(raw).strip().lower()
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
    mult = 1.0
    for suffix, factor in units:
        if text.endswith(suffix) and not (suffix == "s" and text.endswith("ms")):
            mult, text = factor, text[: -len(suffix)]
            break
    try:
        value = float(text) * mult
    except ValueError:
        raise OptionError(f"{PREFIX}{name}={raw!r} is not a duration; use e.g. 0, 30s, 5m or 1h.") from None
    if value < 0:
        raise OptionError(f"{PREFIX}{name}={raw!r} must not be negative; use e.g. 0, 30s or 5m.")
    return value


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    value = str(raw).strip().lower()
    if value not in choices:
        raise OptionError(f"{PREFIX}{name}={raw!r} is not known; use one of: {', '.join(choices)}.")
    return value


def _auto_or_bool(name: str, raw: str) -> bool | str:
    if str(raw).strip().lower() == "auto":
        return "auto"
    try:
        return _bool(name, raw)
    except OptionError:
        raise OptionError(f"{PREFIX}{name}={raw!r} is not known; use auto, true or false.") from None


def _url(name: str, raw: str) -> str | None:
    value = str(raw).strip()
    if not value:
        return None
    if "://" in value:
        scheme = value.split("://", 1)[0]
        if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
            raise OptionError(f"{PREFIX}{name}={raw!r} is not a URL; use e.g. file:///data/ckpt or s3://bucket/path.")
    elif not value.startswith("/"):
        raise OptionError(f"{PREFIX}{name}={raw!r} is neither a URL nor an absolute path; use e.g. file:///data/ckpt.")
    return value


def _bool(name: str, raw: str) -> bool:
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"{PREFIX}{name}={raw!r} is not a boolean; use true or false.")


@dataclass(frozen=True)
class Settings:
    """The validated options of one query, as the worker and configure() see them."""

    storage: str = "filesystem"
    checkpoint_root: str | None = None
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    compression_level: int = 3
    snapshot_interval: int = 10
    memory_max_state_size: int = DEFAULT_MEMORY_MAX_STATE_SIZE
    memory_metadata_dir: str | None = None
    python: str | None = None
    verify_checksums: bool = True
    file_grace_period: float = 300.0
    fsync: bool = True
    savepoint_dir: str | None = None
    prestart_worker: bool = True
    row_images: bool = True
    row_images_min_rows: int = DEFAULT_ROW_IMAGES_MIN_ROWS
    memory_limit: int | None = None   # None: the JVM's default, from Spark's memory model (DESCRIPTIONS)
    row_image_range_reads: bool | str = "auto"   # "auto": by range from row_image_range_reads_min_size
    row_image_range_reads_min_size: int = DEFAULT_RANGE_READS_MIN_SIZE
    row_image_cache_size: int | None = None   # None: the JVM's default, from the local disk's free space

    def reads_by_range(self, image_bytes: int) -> bool:
        """Whether a restore reads a remote row image of this size by range (``rowImages.rangeReads``)."""
        mode = self.row_image_range_reads
        if isinstance(mode, str):   # Settings made in code may hold the option's text
            mode = _auto_or_bool("rowImages.rangeReads", mode)
        if mode == "auto":
            return image_bytes >= self.row_image_range_reads_min_size
        return bool(mode)

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> "Settings":
        """Builds settings from Spark conf entries (full keys with PREFIX, or short keys).

        Unknown keys under the prefix are an error: a typo must not silently
        fall back to a default.
        """
        values: dict[str, Any] = {}
        for key, raw in conf.items():
            short = key[len(PREFIX):] if key.startswith(PREFIX) else key
            if key.startswith("spark.") and not key.startswith(PREFIX):
                continue
            spec = _SPECS.get(short)
            if spec is None:
                known = ", ".join(sorted(_SPECS))
                raise OptionError(f"unknown option {PREFIX}{short}; known options are: {known}.")
            field_name, parse = spec
            values[field_name] = parse(short, raw)
        return replace(cls(), **values)

    def to_conf(self) -> dict[str, str]:
        """The Spark conf entries that reproduce these settings (defaults included)."""
        out = {}
        for short, (field_name, _) in _SPECS.items():
            value = getattr(self, field_name)
            if value is None:
                continue
            out[PREFIX + short] = str(value).lower() if isinstance(value, bool) else str(value)
        return out


def settings_from(options: Mapping[str, str] | Settings | None) -> Settings:
    """Settings from spark_state options (full Spark keys or short names), or defaults."""
    if isinstance(options, Settings):
        return options
    return Settings.from_conf(dict(options or {}))


# short option name -> (Settings field, parser)
_SPECS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "storage": ("storage", lambda n, r: _choice(n, r, STORAGES)),
    "checkpointRoot": ("checkpoint_root", _url),
    "maxParallelism": ("max_parallelism", _positive_int),
    "compressionLevel": ("compression_level", lambda n, r: _positive_int(n, r, 1, 22)),
    "snapshotInterval": ("snapshot_interval", lambda n, r: _positive_int(n, r, 1, 1_000_000)),
    "memory.maxStateSize": ("memory_max_state_size", _size),
    "memory.metadataDir": ("memory_metadata_dir", _url),
    "python": ("python", lambda n, r: str(r).strip() or None),
    "verifyChecksums": ("verify_checksums", _bool),
    "fileGracePeriod": ("file_grace_period", _duration),
    "fsync": ("fsync", _bool),
    "savepointDir": ("savepoint_dir", _url),
    "prestartWorker": ("prestart_worker", _bool),
    "rowImages": ("row_images", _bool),
    "rowImages.minRows": ("row_images_min_rows", lambda n, r: _positive_int(n, r, 0, MAX_MAX_PARALLELISM)),
    "memoryLimit": ("memory_limit", _size),
    "rowImages.rangeReads": ("row_image_range_reads", _auto_or_bool),
    "rowImages.rangeReadsMinSize": ("row_image_range_reads_min_size", _size),
    "rowImages.cacheSize": ("row_image_cache_size", _size),
}

#: Short option name -> its Settings field (the snake_case keyword of configure()).
OPTION_FIELDS = {name: field for name, (field, _) in _SPECS.items()}

#: Short option name -> one-line description, for the user guide (documented()) and conf/.
DESCRIPTIONS = {
    "storage": "Checkpoint storage: 'filesystem' (any fsspec URL, durable) or 'memory' (worker process memory).",
    "checkpointRoot": "Root URL of the filesystem storage. Default: Spark's own state directory of each store.",
    "maxParallelism": f"Number of key groups M, fixed for the life of a checkpoint. Default {DEFAULT_MAX_PARALLELISM}.",
    "compressionLevel": ("zstd level of snapshot files (1-22). Default 3. Deltas, short-lived (compaction "
                         "rewrites them), use zstd's fast level -3."),
    "snapshotInterval": "Deltas after which the worker compacts a full snapshot in the background. Default 10.",
    "memory.maxStateSize": "Memory storage: largest snapshot of one store (e.g. 5m, 64MiB). Default 5 MiB.",
    "memory.metadataDir": "Memory storage: URL where manifests are written durably. Default: none.",
    "python": "Python that runs the worker. Default: spark.pyspark.python, then PYSPARK_PYTHON, then python3.",
    "verifyChecksums": "Check every file's checksum on restore. Default true.",
    "fileGracePeriod": ("How long a worker must see a state file unreferenced by every retained version before "
                        "deleting it (e.g. 0, 30s, 5m). Default 5m."),
    "fsync": "fsync state files, manifests and their directories on local disks before a commit returns. Default true.",
    "savepointDir": "Where spark_state.savepoint() and 'spark-state savepoint' put savepoints by default. Default: none.",
    "prestartWorker": ("Start each executor's worker when the executor starts (through spark_state's spark.plugins "
                       "entry), off the first task's path, and warm up the restore path of the JVM and the worker's "
                       "client of a remote checkpointRoot (one request); false: the first state store starts it. "
                       "Default true."),
    "rowImages": ("Write a row image beside each compacted snapshot (its rows as Spark's UnsafeRows, lookup-ready), "
                  "so a restore looks keys up where they are instead of loading every row. Default true."),
    "rowImages.minRows": (f"Snapshots with fewer rows get no row image (loading them whole is as fast). "
                          f"Default {DEFAULT_ROW_IMAGES_MIN_ROWS:,}."),
    "memoryLimit": ("Memory spark_state may hold in one executor's JVM, all its stores together: rows in the heap, "
                    "the filters and indexes of local runs and row images, the cache of image blocks, change-log "
                    "buffers; e.g. 512m or 2g. Above it a store spills its rows to local disk. Default: half of the "
                    "user memory Spark's memory model leaves, 0.5 * (heap - 300 MiB) * (1 - spark.memory.fraction) "
                    "(145 MiB of a 1 GiB heap with the default fraction 0.6), computed by the JVM."),
    "rowImages.rangeReads": ("On remote checkpoint storage (S3, GCS, ADLS, HDFS, ...), how a restore reads a row "
                             "image: true, by byte range (its index and the blocks its keys need, the rest fetched "
                             "into the executor's local cache in the background); false, downloaded whole before "
                             "the first get; auto, by range when the image has rowImages.rangeReadsMinSize bytes or "
                             "more. Local and NFS checkpoints are read in place either way. Default auto: at 10M "
                             "keys per partition range reads give the first get in 0.1-0.2x the time and a batch "
                             "touching most blocks in about 0.9x; at 3M keys a download is faster for that batch: "
                             "docs/large-state.md, \"Restores on object storage\"."),
    "rowImages.rangeReadsMinSize": ("With rowImages.rangeReads=auto, the size from which a remote row image is read "
                                    "by range, e.g. 64m. Default 64 MiB (about 6M keys of a long key and value)."),
    "rowImages.cacheSize": ("Local disk an executor may use for the blocks of remote row images, all its stores "
                            "together (under spark.local.dir; least recently used images are evicted), e.g. 20g. "
                            "Default: half of the free space of that disk when the executor first needs it."),
}


def documented() -> list[tuple[str, str, str]]:
    """(Spark conf key, ``configure()`` keyword, description) of every option, in definition order.

    The user guide's options table is generated from this (docs/hooks.py), so it cannot drift from the code.
    """
    return [(PREFIX + short, OPTION_FIELDS[short], DESCRIPTIONS[short]) for short in _SPECS]


assert set(DESCRIPTIONS) == set(_SPECS)
assert {f.name for f in fields(Settings)} == {f for f, _ in _SPECS.values()}
