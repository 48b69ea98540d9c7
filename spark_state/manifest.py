"""The per-version manifest (``chk-N/_metadata``): JSON naming the files of a version.

Writing it is what makes a version visible, so it names only complete files,
each with its size and checksum. It lists the version's whole chain (base
snapshot, then deltas, oldest first), so restoring a version reads exactly
one manifest and never follows pointers through older versions, and
retention can tell which files a kept version needs from its manifest alone.

The manifest carries a CRC-32 of its own canonical body: a torn or edited
manifest fails with ``ChecksumMismatch`` instead of restoring wrong state.
"""

from __future__ import annotations

import json
import secrets
import time
import zlib
from dataclasses import asdict, dataclass, field

from spark_state.errors import ChecksumMismatch, FormatVersionError

#: Bumped when a reader of the previous version could misread a new manifest.
FORMAT_VERSION = 1

SNAPSHOT = "snapshot"
DELTA = "delta"


@dataclass(frozen=True)
class FileEntry:
    """One data file of a chain: where it is, how to verify it, where its key-group index starts."""

    path: str            # relative to the store root, e.g. "shared/v0000000007-delta-3f2a….arrow"
    kind: str            # SNAPSHOT (full state, no deletes) or DELTA (changes; value null = delete)
    version: int         # the version whose commit (or compaction) wrote it
    size: int
    checksum: str        # "crc32:xxxxxxxx" of the whole file
    rows: int
    index_offset: int    # key-group index location inside the file
    index_length: int
    index_checksum: str


@dataclass(frozen=True)
class Manifest:
    version: int
    max_parallelism: int
    files: tuple[FileEntry, ...]
    rows: int | None            # rows of the state at this version; None when the chain has deltas
    commit_id: str = field(default_factory=lambda: secrets.token_hex(8))
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    format: int = FORMAT_VERSION

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def deltas_since_snapshot(self) -> int:
        return sum(1 for f in self.files if f.kind == DELTA)

    def to_json(self) -> bytes:
        body = asdict(self)
        body["files"] = [asdict(f) for f in self.files]
        body["checksum"] = _body_crc(body)
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, name: str) -> "Manifest":
        """Parses and verifies a manifest; `name` says which file in error messages."""
        try:
            body = json.loads(data)
            fmt = body["format"]
        except (ValueError, TypeError, KeyError):
            raise ChecksumMismatch(f"manifest {name} is not valid JSON or lacks its format; it is corrupted or truncated.") from None
        if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
            raise FormatVersionError(
                f"manifest {name} has format version {fmt}, newer than the {FORMAT_VERSION} this spark_state "
                f"reads; it was written by a newer spark_state. Upgrade spark_state on the executors (or restore "
                f"with the version that wrote the checkpoint)."
            )
        recorded = body.pop("checksum", None)
        if recorded != _body_crc(body):
            raise ChecksumMismatch(f"manifest {name} does not match its own checksum; it is corrupted or was edited.")
        try:
            files = tuple(FileEntry(**f) for f in body.pop("files"))
            return cls(files=files, **body)
        except TypeError as err:
            raise ChecksumMismatch(f"manifest {name} has unexpected fields ({err}).") from None


def _body_crc(body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return f"crc32:{zlib.crc32(canonical):08x}"
