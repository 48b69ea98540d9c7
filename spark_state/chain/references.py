"""Cross-store references: which files of a store other stores' manifests name.

After a metadata-only rescale (``spark_state.lifecycle.rescale``) a new
partition's manifest names files that old partitions wrote, in their
directories. The store that holds such a file must not delete it while any
manifest of another store may still name it, and it cannot see those
manifests in its own directory. So the rescale first writes, in the store
that holds the files, one *reference record* per referring store
(``refs/p<partition>-v<version>-<random>.json``: the referring partition,
the first version of it that names the files, and the files), then the
manifests.

Retention (``spark_state.chain.retention``) counts every file a live record names
as referenced, exactly like a file its own kept manifests name. A record is
*dead* only when the referring store has at least one manifest at or above
the record's version and every such manifest was read and names no file of
this store; any doubt keeps it (no manifest at or above the version yet: the
rescale is still writing; a manifest that vanished between listing and
reading; a listing that failed). A record whose body is unreadable (a rescale
that crashed while writing it) is judged by its name, which carries the
partition and version; while it is not dead, no file of the store is deleted
at all. A dead record is deleted by the store that holds the files.

Why "dead" is final, across processes (docs/consistency.md, rule 6): a
referring store names our files only through a chain that starts with the
rescaled version, and a commit carries its base's files forward. A commit
in flight builds on a version its store's retention keeps (the window), and
reads that base manifest fresh, so while any commit may still write a
manifest naming our files, a present manifest at or above the record's
version names them. Nothing but a new rescale (which writes new records
first, with the query stopped) makes a store name another store's files.
"""

from __future__ import annotations

import json
import logging
import zlib
from dataclasses import dataclass
from typing import Callable

from spark_state.errors import ChecksumMismatch, SparkStateError
from spark_state.format.manifest import Manifest
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.layout import REFS_DIR, manifest_path, new_reference_path, reference_of

log = logging.getLogger(__name__)

Siblings = Callable[[int], CheckpointStorage]
"""The storage of the store of another partition of the same operator and store name."""


@dataclass(frozen=True)
class Reference:
    partition: int           # the referring store's partition
    version: int             # the first version of the referring store that names the files
    files: tuple[str, ...]   # paths in this store

    def to_json(self) -> bytes:
        body = {"partition": self.partition, "version": self.version, "files": list(self.files)}
        body["checksum"] = _crc(body)
        return json.dumps(body, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, name: str = "reference record") -> "Reference":
        """Parses and verifies a record: a damaged one is a ChecksumMismatch, never other files (retention
        would delete the files it really names). Records of releases before the checksum have none."""
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            raise ChecksumMismatch(f"{name} is not valid JSON; it is corrupted or truncated.") from None
        if not isinstance(body, dict) or set(body) - {"checksum"} != _FIELDS:
            raise ChecksumMismatch(f"{name} does not hold exactly {sorted(_FIELDS)}; it is corrupted.")
        if "checksum" in body and body.pop("checksum") != _crc(body):
            raise ChecksumMismatch(f"{name} does not match its own checksum; it is corrupted or was edited.")
        partition, version, files = body["partition"], body["version"], body["files"]
        if not (_is_int(partition) and _is_int(version) and isinstance(files, list)
                and all(isinstance(f, str) for f in files)):
            raise ChecksumMismatch(f"{name} has fields of the wrong types; it is corrupted.")
        return cls(partition, version, tuple(files))


_FIELDS = {"partition", "version", "files"}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _crc(body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return f"crc32:{zlib.crc32(canonical):08x}"


def write_reference(storage: CheckpointStorage, ref: Reference) -> str:
    """Records that `ref.partition` names `ref.files` of `storage`; returns the record's path."""
    path = new_reference_path(ref.partition, ref.version)
    storage.write_file(path, ref.to_json())
    return path


def _still_named(referrer: CheckpointStorage, partition: int, since: int) -> bool:
    """True unless `referrer` has a manifest at or above `since` and every such manifest was read and none
    names a file of `partition`'s store. Oldest first: the rescaled version itself names the files until
    the referrer's retention drops it, so a live record usually costs one read."""
    try:
        versions = [v for v in referrer.list_versions() if v >= since]
    except (SparkStateError, OSError):
        return True
    if not versions:
        return True
    for v in versions:
        try:
            manifest = Manifest.from_json(referrer.read_manifest(v), f"{referrer.root}/{manifest_path(v)}")
        except (SparkStateError, OSError):
            return True
        if any(f.partition == partition for f in manifest.files):
            return True
    return False


def referenced_elsewhere(storage: CheckpointStorage, partition: int, siblings: Siblings,
                         prune: bool = True) -> set[str] | None:
    """Files of `storage` (the store of `partition`) that live records name; None when a record cannot be
    read (then nothing may be deleted). With `prune`, records proven dead are deleted."""
    keep: set[str] = set()
    unknown = False
    for path in storage.list_files(REFS_DIR):
        named = reference_of(path)
        if named is None:
            continue   # not a record (a temporary file of an object store client, a note left by hand)
        referrer, since = named
        ref = None
        try:
            ref = Reference.from_json(storage.read_file(path), f"reference record {storage.root}/{path}")
        except FileNotFoundError:
            continue   # another process pruned it meanwhile
        except (SparkStateError, OSError, ValueError, KeyError, TypeError) as err:
            log.warning("reference record %s/%s is unreadable (%s)", storage.root, path, err)
        if _still_named(siblings(referrer), partition, since):
            if ref is None:
                unknown = True   # someone names files of ours, and we cannot tell which: delete none
            else:
                keep.update(ref.files)
        elif prune:
            log.info("%s: partition %d no longer names files of this store; dropping %s", storage.root,
                     ref.partition, path)
            storage.delete_files([path])
    return None if unknown else keep
