"""What spark_state left on disk for a query, read directly (no Spark, no worker).

Default root only: a store's files are in Spark's own state directory of it,
``<checkpoint>/state/<operator>/<partition>/`` (docs/format.md, "Checkpoint layout").
"""

from __future__ import annotations

from pathlib import Path

from spark_state.errors import SparkStateError, VersionNotFound
from spark_state.format.manifest import CompactionRecord, Manifest
from tests.support.stores import open_stored, store_root
from tests.support.waiting import wait_until

#: Number of shuffle partitions of the cluster session (conftest).
PARTITIONS = 2


def _present(store: Path, name: str, parse) -> dict:
    """version -> parse(``chk-N/<name>``) for the files present now (one deleted meanwhile is skipped)."""
    out = {}
    for path in sorted(store.glob(f"chk-*/{name}")):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        out[int(path.parent.name[4:])] = parse(data, str(path))
    return out


def manifests(store: Path) -> dict[int, Manifest]:
    """version -> manifest, for the manifests present now."""
    return _present(store, "_metadata", Manifest.from_json)


def records(store: Path) -> dict[int, CompactionRecord]:
    """version -> compaction record (``chk-N/_snapshot``) present now."""
    return _present(store, "_snapshot", CompactionRecord.from_json)


def data_files(store: Path) -> set[str]:
    """Data files (``shared/...``) present now, relative to the store directory."""
    shared = store / "shared"
    return {f"shared/{p.name}" for p in shared.iterdir()} if shared.is_dir() else set()


def unreferenced(store: Path) -> set[str]:
    """Data files no present manifest or compaction record names."""
    named = set()
    for manifest in manifests(store).values():
        named.update(manifest.paths)
    for record in records(store).values():
        named.add(record.snapshot.path)
    return data_files(store) - named


def files_of_version(store: Path, version: int) -> set[str]:
    """Data files written for ``version`` (their names start with it), present now."""
    return {f for f in data_files(store) if f.startswith(f"shared/v{version:010d}-")}


def versions(checkpoint: Path, partition: int) -> list[int]:
    return sorted(manifests(store_root(checkpoint, partition=partition)))


def check_versions_load(checkpoint: Path, partitions: int = PARTITIONS) -> dict[int, list[int]]:
    """Loads every version present, checksums verified: every file a manifest names is intact.

    Returns partition -> versions loaded. A version that retention deleted while
    this ran is skipped; any other error (a missing or corrupt file) fails.
    """
    loaded = {}
    for partition in range(partitions):
        store = open_stored(checkpoint, partition=partition)
        loaded[partition] = []
        for version in store.versions():
            try:
                store.load(version)
            except VersionNotFound:
                if version in store.versions():
                    raise
                continue
            except SparkStateError as err:
                raise AssertionError(f"partition {partition}, version {version} of {checkpoint} "
                                     f"does not load: {err}") from None
            loaded[partition].append(version)
    return loaded


def stored_totals(spark, checkpoint: Path, batch: int | None = None, **options) -> dict[str, tuple[int, int]]:
    """key -> (total, n) as Spark's own ``statestore`` reader reads the state (latest by default).

    ``options`` are the query's spark_state options (a ``checkpoint_root`` must be given again).
    """
    from tests.support.spark import provider_conf, sql_conf

    reader = spark.read.format("statestore")
    if batch is not None:
        reader = reader.option("batchId", batch)
    from tests.cluster.running_totals import brief

    with sql_conf(spark, provider_conf("spark_state", **options)):
        try:
            rows = reader.load(str(checkpoint)).collect()
        except Exception as err:  # noqa: BLE001 - Py4JJavaError: keep what went wrong, not the traces
            raise AssertionError(f"Spark's statestore reader cannot read {checkpoint}:\n{brief(str(err))}") from None
    out = {}
    for row in rows:
        state = row["value"]["groupState"] if "groupState" in row["value"] else row["value"]
        out[row["key"]["k"]] = (state["total"], state["n"])
    return out


def wait_collected(checkpoint: Path, files: dict[int, set[str]], timeout: float = 30) -> None:
    """Waits until none of ``files`` (partition -> paths) is present and unreferenced.

    Call it while the query runs (in a batch callback): Spark runs state store
    maintenance only for stores a running query has loaded.
    """
    def left():
        return {p: sorted(f & unreferenced(store_root(checkpoint, partition=p))) for p, f in files.items()
                if f & unreferenced(store_root(checkpoint, partition=p))}

    wait_until(lambda: not left(), timeout,
               f"unreferenced file(s) not collected within {timeout}s: {left()}")


def unreferenced_now(checkpoint: Path, partitions: int = PARTITIONS) -> dict[int, set[str]]:
    return {p: unreferenced(store_root(checkpoint, partition=p)) for p in range(partitions)}


def assert_maintained(checkpoint: Path, partitions: int = PARTITIONS) -> None:
    """Retention and compaction ran on every store: version 1 is gone, and a retained version has a
    compaction record or a chain that starts with a snapshot compacted after version 1."""
    for partition in range(partitions):
        store = store_root(checkpoint, partition=partition)
        present = manifests(store)
        assert present and 1 not in present, f"partition {partition}: retention never ran: versions {sorted(present)}"
        compacted = set(records(store)) | {v for v, m in present.items()
                                           if m.files and m.files[0].kind == "snapshot" and m.files[0].version > 1}
        assert compacted, f"partition {partition}: no retained version was compacted " \
                          f"({ {v: [f.path for f in m.files] for v, m in present.items()} })"
