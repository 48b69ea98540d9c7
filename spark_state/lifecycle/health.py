"""Whether each retained version of a store can load, judged from its manifest and a listing of the files
(what ``spark-state ls`` marks): the manifest parses and describes its version, and every file it names is
there at the size it records. No data file is read; ``spark-state validate`` reads them all and checks
their checksums.

A version whose manifest names a missing file still loads when its compaction record (``chk-N/_snapshot``)
is valid and its snapshot is there, as a load would read it (``chain/reader.py``, ``VersionView``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from spark_state.errors import SparkStateError
from spark_state.format.manifest import CompactionRecord, FileEntry, Manifest
from spark_state.storage.directory import Dir
from spark_state.storage.layout import COMPACTION_NAME, MANIFEST_NAME, StoreId, manifest_path, record_path

#: Manifests read at once: on an object store each is a round trip.
READERS = 16
#: root URL -> {relative path: size}: the listing of a store directory, made once per root.
Listings = Callable[[str], dict[str, int]]


@dataclass
class StoreHealth:
    """One store's retained versions and, for each that cannot load, why (the first problem found)."""

    sid: StoreId
    root: str
    files: dict[str, int]
    versions: list[int]
    broken: dict[int, str] = field(default_factory=dict)


def listings() -> Listings:
    """A cache of store listings (a rescaled chain names files in other partitions' directories)."""
    cache: dict[str, dict[str, int]] = {}

    def of(root: str) -> dict[str, int]:
        if root not in cache:
            cache[root] = Dir(root).files()
        return cache[root]

    return of


def store_health(sid: StoreId, root: str, root_of: Callable[[StoreId], str], listing: Listings) -> StoreHealth:
    """Checks every version whose manifest the listing of `root` holds; `root_of` places another partition's
    store (the files of a rescaled chain)."""
    files = listing(root)
    versions = sorted(v for p in files if (v := _manifest_version(p)) is not None)
    health = StoreHealth(sid, root, files, versions)
    chain = _Chain(sid, root, root_of, listing)
    for v, why in zip(versions, _each_at_once(chain.why_broken, versions)):
        if why is not None:
            health.broken[v] = why
    return health


def _manifest_version(rel: str) -> int | None:
    head, _, rest = rel.partition("/")
    if rest != MANIFEST_NAME or not head.startswith("chk-") or not head[4:].isdigit():
        return None
    return int(head[4:])


def _each_at_once(check: Callable[[int], str | None], versions: list[int]) -> list[str | None]:
    """`check` of every version, a few at once: each reads a manifest, a round trip on an object store."""
    with ThreadPoolExecutor(READERS) as pool:
        return list(pool.map(check, versions))


@dataclass(frozen=True)
class _Chain:
    """The files of one store's chains, as the listings show them."""

    sid: StoreId
    root: str
    root_of: Callable[[StoreId], str]
    listing: Listings

    def why_broken(self, v: int) -> str | None:
        """Why version `v` cannot load, or None."""
        where = Dir(self.root)
        name = where.url_of(manifest_path(v))
        try:
            manifest = Manifest.from_json(where.read(manifest_path(v)), name)
        except (SparkStateError, OSError) as err:
            return str(err) if isinstance(err, SparkStateError) else f"{name} cannot be read ({err})"
        if manifest.version != v:
            return f"{name} describes version {manifest.version}, not {v}"
        missing = self.missing(manifest.files)
        if missing is None or self.compacted(v, manifest):
            return None
        return missing

    def missing(self, entries) -> str | None:
        """The first file of `entries` that is not where the chain says at the size it records, as a sentence."""
        for entry in entries:
            holder = self.root if entry.partition is None else self.root_of(replace(self.sid, partition=entry.partition))
            present = self.listing(holder)
            for path, size in _named(entry):
                if path not in present:
                    return f"{Dir(holder).url_of(path)} is missing"
                if present[path] != size:
                    return f"{Dir(holder).url_of(path)} has {present[path]} bytes, its manifest says {size}"
        return None

    def compacted(self, v: int, manifest: Manifest) -> bool:
        """Whether version `v` loads from its compaction record instead of its manifest's chain."""
        rel = record_path(v, COMPACTION_NAME)
        if rel not in self.listing(self.root):
            return False
        where = Dir(self.root)
        try:
            record = CompactionRecord.from_json(where.read(rel), where.url_of(rel))
        except (SparkStateError, OSError):
            return False
        return record.commit_id == manifest.commit_id and record.version == v and self.missing((record.snapshot,)) is None


def _named(entry: FileEntry) -> list[tuple[str, int]]:
    return [(entry.path, entry.size)] + ([(entry.image.path, entry.image.size)] if entry.image is not None else [])
