"""Where a store's files are: the names inside a store's directory, and where that directory is.

The layout itself (what ``chk-N/``, ``shared/`` and ``refs/`` hold, with and
without ``checkpointRoot``) is described once, in docs/format.md, "Checkpoint
layout". This module is its code: every path spark_state writes or reads is
built here, so the worker and the offline tools cannot drift apart on it.

A store is named by ``StoreId`` (operator, partition, store name), and
located in one query's checkpoint by ``StoreRef`` (what Spark's
``StateStoreId`` gives the shim: the state directory, the store's directory,
the query id). ``resolve_root`` turns a ``StoreRef`` into the URL of the
store's own directory.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, replace
from typing import Sequence

from spark_state.options import Settings
from spark_state.storage.urls import normalize_url

# ----------------------------------------------------------------- inside a store's directory

MANIFEST_NAME = "_metadata"
COMPACTION_NAME = "_snapshot"
#: A lineage manifest ``chk-N/_metadata-<commit id>``: the manifest of one commit of version N, kept beside
#: ``_metadata`` (the version's latest commit) when Spark names versions by checkpoint id (checkpoint format
#: v2), so every attempt's commit of a batch stays loadable by its id (docs/consistency.md, rule 7).
LINEAGE_PREFIX = MANIFEST_NAME + "-"
SHARED_DIR = "shared"
REFS_DIR = "refs"
#: Names inside a store directory that belong to spark_state (everything else there is Spark's).
STORE_ENTRIES = ("chk-", SHARED_DIR, REFS_DIR)

_CHK = re.compile(r"^chk-(\d+)$")
_SHARED = re.compile(r"^shared/v(\d+)-([a-z]+)-([0-9a-f]+)\.(arrow|img)$")
#: The kind part of a row image's file name (``image_path``); data files are named by their FileEntry kind.
IMAGE_KIND = "image"
_REFERENCE = re.compile(r"^p(\d+)-v(\d+)-[0-9a-f]+\.json$")


def record_path(version: int, name: str) -> str:
    """Path of one of version N's records (``_metadata``, ``_snapshot``)."""
    return f"chk-{version}/{name}"


def manifest_path(version: int) -> str:
    return record_path(version, MANIFEST_NAME)


_COMMIT_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


def lineage_name(commit_id: str) -> str:
    """The record name of the lineage manifest of commit `commit_id` (``_metadata-<commit id>``)."""
    if not isinstance(commit_id, str) or not _COMMIT_ID.match(commit_id):
        raise ValueError(f"{commit_id!r} is not a commit id (1-64 letters, digits, '_' or '-')")
    return LINEAGE_PREFIX + commit_id


def lineage_of(name: str) -> str | None:
    """The commit id of a lineage manifest's record name, else None."""
    if not name.startswith(LINEAGE_PREFIX):
        return None
    commit_id = name[len(LINEAGE_PREFIX):]
    return commit_id if _COMMIT_ID.match(commit_id) else None


def version_dir_of(name: str) -> int | None:
    """The N of a 'chk-N' directory name, else None."""
    m = _CHK.match(name)
    return int(m.group(1)) if m else None


def new_file_path(version: int, kind: str) -> str:
    """A fresh, never-reused path in shared/ for a data file written for `version`.

    The random part means a re-commit never overwrites a file a manifest names;
    the version part lets retention tell a crashed commit's leftovers from an
    in-flight one (``file_version``).
    """
    return f"{SHARED_DIR}/v{version:010d}-{kind}-{secrets.token_hex(8)}.arrow"


def image_path(snapshot_path: str) -> str:
    """Where the row image of the snapshot at `snapshot_path` goes: beside it, the same version and random part,
    so an image's name says which snapshot it shows (and retention dates it like any data file)."""
    m = _SHARED.match(snapshot_path)
    if m is None:
        raise ValueError(f"{snapshot_path!r} is not a data file of shared/")
    return f"{SHARED_DIR}/v{m.group(1)}-{IMAGE_KIND}-{m.group(3)}.img"


def file_version(path: str) -> int | None:
    """The version a shared data file was written for, from its name; None for foreign files."""
    m = _SHARED.match(path)
    return int(m.group(1)) if m else None


def new_reference_path(partition: int, version: int) -> str:
    """A fresh path in refs/ for a reference record of referring `partition` from `version` on."""
    return f"{REFS_DIR}/p{partition:05d}-v{version:010d}-{secrets.token_hex(4)}.json"


def reference_of(path: str) -> tuple[int, int] | None:
    """(referring partition, version) from a reference record's path; None for anything else in refs/."""
    m = _REFERENCE.match(path.rsplit("/", 1)[-1])
    return (int(m.group(1)), int(m.group(2))) if m else None


def format_versions(versions: Sequence[int]) -> str:
    """'1-5, 8' for [1, 2, 3, 4, 5, 8]; 'none' when empty."""
    if not versions:
        return "none"
    runs, start, prev = [], versions[0], versions[0]
    for v in list(versions[1:]) + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(runs)


# ----------------------------------------------------------------- which store, and where its directory is

#: The store name of operators with one store (Spark's StateStoreId.DEFAULT_STORE_NAME).
DEFAULT_STORE = "default"


@dataclass(frozen=True, order=True)
class StoreId:
    """One state store of a query: (operator, partition, store name)."""

    operator: int
    partition: int
    name: str = DEFAULT_STORE

    def __str__(self) -> str:
        return f"operator {self.operator}, partition {self.partition}" + (
            "" if self.name == DEFAULT_STORE else f", store {self.name}")

    @property
    def spark_path(self) -> str:
        """Spark's directory of this store below the state directory: ``<op>/<p>[/<name>]``."""
        return f"{self.operator}/{self.partition}" + ("" if self.name == DEFAULT_STORE else f"/{self.name}")

    @property
    def rel(self) -> str:
        """Spark's directory of this store relative to the checkpoint: ``state/<op>/<p>[/<name>]``."""
        return f"state/{self.spark_path}"

    @property
    def named_path(self) -> str:
        """This store's directory below one checkpoint's directory under ``checkpointRoot``: ``<op>/<p>/<name>``."""
        return f"{self.operator}/{self.partition}/{self.name}"

    def in_partition(self, partition: int) -> "StoreId":
        """The store of the same operator and name in another partition."""
        return replace(self, partition=partition)


@dataclass(frozen=True)
class StoreRef:
    """A store located in one query's checkpoint, as Spark's StateStoreId names it to the shim."""

    spark_root: str   # StateStoreId.checkpointRootLocation, e.g. "file:/tmp/q/state"
    location: str     # StateStoreId.storeCheckpointLocation URI, e.g. "file:/tmp/q/state/0/3"
    operator: int
    partition: int
    name: str = DEFAULT_STORE
    query_id: str | None = None   # Spark's query id (<checkpointLocation>/metadata): the timeline

    @classmethod
    def of(cls, spark_root: str, sid: StoreId, query_id: str | None = None) -> "StoreRef":
        """`sid` in the checkpoint whose state directory is `spark_root`, in Spark's own layout."""
        return cls(spark_root=spark_root, location=f"{spark_root.rstrip('/')}/{sid.spark_path}",
                   operator=sid.operator, partition=sid.partition, name=sid.name, query_id=query_id)

    @property
    def id(self) -> StoreId:
        return StoreId(self.operator, self.partition, self.name)

    def sibling(self, partition: int) -> "StoreRef":
        """The store of the same operator and name in another partition (a rescaled chain names its files)."""
        return StoreRef.of(self.spark_root, self.id.in_partition(partition), self.query_id)


def checkpoint_digest(spark_root: str, query_id: str | None) -> str:
    """The directory name of one checkpoint's stores under a shared root.

    Spark's state directory tells two queries apart; the query id (from
    ``<checkpointLocation>/metadata``) tells a deleted and re-created checkpoint
    at the same path from the one before it, so the two timelines never mix.
    """
    identity = str(spark_root) if not query_id else f"{spark_root}\0{query_id}"
    return hashlib.sha1(identity.encode()).hexdigest()[:16]


def _under(base_url: str, ref: StoreRef) -> str:
    base = normalize_url(base_url).rstrip("/")
    return f"{base}/{checkpoint_digest(ref.spark_root, ref.query_id)}/{ref.id.named_path}"


def resolve_root(ref: StoreRef, settings: Settings) -> str:
    """The root URL of one store: Spark's own directory for it, or a private one under checkpoint_root.

    Spark's own directory goes away with the checkpoint, so it needs no query
    id; under a shared checkpoint_root, ``checkpoint_digest`` keeps queries and
    timelines apart and operator/partition/name keep their stores apart. Memory
    storage keys its in-process registry by the same root, so it gets the query id too.
    """
    if settings.checkpoint_root is None:
        root = normalize_url(ref.location).rstrip("/")
        return root if settings.storage != "memory" or not ref.query_id else f"{root}#{ref.query_id}"
    return _under(settings.checkpoint_root, ref)


def metadata_root(ref: StoreRef, settings: Settings) -> str | None:
    """Where memory storage writes this store's manifests durably (``memory.metadataDir``), if anywhere."""
    return _under(settings.memory_metadata_dir, ref) if settings.memory_metadata_dir else None
