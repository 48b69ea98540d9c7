"""The state-store providers the benchmarks compare, and how to turn each one on."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

HDFS_CLASS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_CLASS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SPARK_STATE_CLASS = "io.sparkstate.shim.SparkStateProvider"
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
SS = "spark.sql.streaming.stateStore.sparkState."
#: The A/B variants of spark_state's provider (benchmarks/jvm/VariantProviders.java): compiled beside the
#: shim jar for the JVM scenarios (micro, restore, memory); the end-to-end scenarios run the real jar only.
VARIANTS = "io.sparkstate.shim.VariantProviders"

#: Memory storage keeps every snapshot in the worker's memory and refuses one
#: bigger than memory.maxStateSize (5 MiB by default). The benchmarks raise it
#: explicitly so the same sizes run on both storages; the report says so.
BENCH_MEMORY_MAX_STATE_SIZE = "2g"


@dataclass(frozen=True)
class Provider:
    name: str                     # short id used in file names and JSON
    label: str                    # what the report calls it
    cls: str                      # spark.sql.streaming.stateStore.providerClass
    confs: dict = field(default_factory=dict)
    spark_state: bool = False     # ours (numerator of every ratio) or a peer
    storage: str | None = None

    @property
    def variant(self) -> bool:
        """One of VariantProviders: runs in the JVM scenarios only."""
        return self.cls.startswith(VARIANTS + "$")

    def sql_confs(self) -> dict[str, str]:
        return {"spark.sql.streaming.stateStore.providerClass": self.cls, **self.confs}


def all_providers(python: str | None = None) -> list[Provider]:
    python = python or sys.executable
    return [
        Provider("hdfs", "HDFS (default)", HDFS_CLASS),
        Provider("rocksdb", "RocksDB", ROCKSDB_CLASS, {CHANGELOG_KEY: "false"}),
        Provider("rocksdb_changelog", "RocksDB+changelog", ROCKSDB_CLASS, {CHANGELOG_KEY: "true"}),
        Provider("spark_state_fs", "spark_state (filesystem)", SPARK_STATE_CLASS,
                 {SS + "storage": "filesystem", SS + "python": python},
                 spark_state=True, storage="filesystem"),
        Provider("spark_state_fs_f1", "spark_state (filesystem, file format 1)", VARIANTS + "$OpaqueRows",
                 {SS + "storage": "filesystem", SS + "python": python},
                 spark_state=True, storage="filesystem"),
        Provider("spark_state_fs_aw", "spark_state (filesystem, Spark's ArrowWriter for every schema)",
                 VARIANTS + "$ArrowWriterOnly", {SS + "storage": "filesystem", SS + "python": python},
                 spark_state=True, storage="filesystem"),
        Provider("spark_state_fs_atcommit", "spark_state (filesystem, changes encoded at commit)",
                 VARIANTS + "$EncodeAtCommit", {SS + "storage": "filesystem", SS + "python": python},
                 spark_state=True, storage="filesystem"),
        Provider("spark_state_fs_256m", "spark_state (filesystem, memoryLimit=256m)", SPARK_STATE_CLASS,
                 {SS + "storage": "filesystem", SS + "python": python, SS + "memoryLimit": "256m"},
                 spark_state=True, storage="filesystem"),
        Provider("spark_state_fs_cold", "spark_state (filesystem, worker not prestarted)", SPARK_STATE_CLASS,
                 {SS + "storage": "filesystem", SS + "python": python, SS + "prestartWorker": "false"},
                 spark_state=True, storage="filesystem"),
        Provider("spark_state_mem", "spark_state (memory)", SPARK_STATE_CLASS,
                 {SS + "storage": "memory", SS + "python": python,
                  SS + "memory.maxStateSize": BENCH_MEMORY_MAX_STATE_SIZE},
                 spark_state=True, storage="memory"),
    ]


PEERS = ("hdfs", "rocksdb", "rocksdb_changelog")
OURS = ("spark_state_fs", "spark_state_mem")


def spark_state_status(build: bool = True) -> tuple[Path | None, str | None]:
    """(shim jar, None) when spark_state can run, else (None, why not)."""
    if importlib.util.find_spec("spark_state.worker") is None:
        return None, "spark_state.worker is missing"
    try:
        from spark_state import shim_jar
    except Exception as exc:  # noqa: BLE001 - report any import problem as the reason
        return None, f"spark_state.shim_jar unavailable: {exc!r}"
    try:
        jar = Path(shim_jar(build=build))
    except Exception as exc:  # noqa: BLE001
        return None, f"shim build failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)}"
    if not jar.exists():
        return None, f"shim jar {jar} does not exist"
    return jar, None
