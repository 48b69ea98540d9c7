"""The per-version manifest (``chk-N/_metadata``): JSON naming the files of a version.

Writing it is what makes a version visible, so it names only complete files,
each with its size and checksum. It lists the version's whole chain (base
snapshot, then deltas, oldest first), so restoring a version reads exactly
one manifest and never follows pointers through older versions, and
retention can tell which files a kept version needs from its manifest alone.

The manifest carries a CRC-32 of its own canonical body: a torn or edited
manifest fails with ``ChecksumMismatch`` instead of restoring wrong state.

Each record is written in the lowest ``ManifestFormat`` that describes it,
so older readers read what they can and refuse the rest:

``rows`` (any format) is the number of keys in the state at this version
when it is known, else null. A snapshot-only chain always knew it (its
file's rows); since issue 35 a delta version records the count the JVM
sends with its commit (it counts every version's keys exactly), so a
restart answers Spark's ``numRowsTotal`` without a pass over the state. No
format is bumped for it: the field and its meaning are the ones every
release wrote and read, and older readers treat it as they always did (a
figure they report, e.g. in a savepoint's metadata, never a fact a load
relies on). Readers must treat null as "unknown", never as zero.

Format 5 gives a snapshot entry its *row image* (``image``: the same rows as
Spark's UnsafeRow records, lookup-ready, see ``spark_state.format.rowimage``),
which the JVM looks keys up in instead of loading every row. The image is
derived from the snapshot and never the only copy of a row.

Format 6 gives a row image entry its *tail* (``tail``: base64 of the image's last bytes, the filter
header, page directory and trailer a reader by byte range needs before its first lookup, see
``spark_state.format.rowimage.read_tail``) when it is at most ``INLINE_TAIL_MAX`` bytes, so a restore
from object storage needs no request for it: the manifest it reads anyway has it. A copy of bytes of the
image, never the truth: a tail that does not parse costs only the request it saved.

Format 4 names typed data files (``file_format`` 2 in an entry, see
``spark_state.format.datafile``); a format-3 reader refuses it with
``FormatVersionError`` instead of taking typed columns for row bytes.

Format 3 (written only by a rescale, see ``spark_state.lifecycle.rescale``)
adds *slices*: an entry may name a file of another partition's store of the
same operator (``partition``) and stand for only the rows Spark routes to
one partition of another partition count (``modulus``, ``residue``: the rows
with ``pmod(hash, modulus) == residue``). A manifest without slices is
written as format 2, byte for byte as before; a reader of format 2 refuses a
format 3 manifest with ``FormatVersionError`` instead of reading whole files
that are only partly this store's.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import zlib
from dataclasses import asdict, dataclass, field
from enum import IntEnum

from spark_state.errors import ChecksumMismatch, FormatVersionError
from spark_state.format.datafile import EncodedFile, FileFormat


class ManifestFormat(IntEnum):
    """A manifest's (or compaction record's) format: bumped when a reader of the previous one could misread it."""

    #: manifests name the query (``query_id``); compaction records (``chk-N/_snapshot``). Manifests without
    #: slices or typed files keep it, byte for byte what format-2 readers read.
    PLAIN = 2
    #: slices (a rescaled chain names other partitions' files, see the module docstring)
    SLICED = 3
    #: typed data files (entries with ``file_format`` 2), with or without slices
    TYPED = 4
    #: snapshot entries with their row image (``image``)
    IMAGED = 5
    #: row image entries with their tail (``image.tail``)
    TAILED = 6


#: The newest manifest format this code reads.
NEWEST_MANIFEST_FORMAT = ManifestFormat.TAILED

#: The largest image tail an entry carries (bytes before base64): an image of about 45M records at most.
INLINE_TAIL_MAX = 32 << 10

SNAPSHOT = "snapshot"
DELTA = "delta"


@dataclass(frozen=True)
class ImageEntry:
    """The row image of a snapshot file: its rows as lookup-ready UnsafeRow records (format/rowimage.py)."""

    path: str            # relative to the store root, e.g. "shared/v0000000012-image-3f2a….img"
    size: int
    checksum: str        # "crc32:xxxxxxxx" of the whole file
    rows: int
    tail: str | None = None   # format 6: base64 of the file's last bytes (``rowimage.WrittenImage.tail``)

    @classmethod
    def written(cls, path: str, encoded) -> "ImageEntry":
        """The entry of a row image just encoded (``rowimage.EncodedImage`` or ``WrittenImage``) and about to be
        written at `path`, with its tail when that is small enough (``INLINE_TAIL_MAX``)."""
        tail = encoded.tail
        return cls(path=path, size=encoded.size, checksum=encoded.checksum, rows=encoded.rows,
                   tail=base64.b64encode(tail).decode() if 0 < len(tail) <= INLINE_TAIL_MAX else None)

    @property
    def tail_bytes(self) -> bytes:
        """The file's last bytes the entry holds (empty without ``tail``, or when it is not base64: then the
        tail is read from the file, as before format 6)."""
        if self.tail is None:
            return b""
        try:
            return base64.b64decode(self.tail, validate=True)
        except (ValueError, TypeError):
            return b""


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
    # format 3, slices (see the module docstring); None = the whole file of this store
    partition: int | None = None   # the file is in the store of this partition (same operator and store name)
    modulus: int | None = None     # only the rows with pmod(hash, modulus) == residue
    residue: int | None = None
    #: the data file's FileFormat (only written when not OPAQUE)
    file_format: int = FileFormat.OPAQUE
    #: format 5: a snapshot's row image (only written when there is one; never on a slice)
    image: ImageEntry | None = None

    @classmethod
    def written(cls, path: str, kind: str, version: int, encoded: EncodedFile) -> "FileEntry":
        """The entry of a data file just encoded (and about to be written) at `path`."""
        return cls(path=path, kind=kind, version=version, size=encoded.size, checksum=encoded.checksum,
                   rows=encoded.rows, index_offset=encoded.index_offset, index_length=encoded.index_length,
                   index_checksum=encoded.index_checksum, file_format=encoded.file_format)

    @classmethod
    def from_dict(cls, body: dict) -> "FileEntry":
        image = body.pop("image", None)
        return cls(**body, image=None if image is None else ImageEntry(**image))

    @property
    def typed(self) -> bool:
        return self.file_format >= FileFormat.TYPED

    @property
    def paths(self) -> tuple[str, ...]:
        """The files this entry names: the data file, and its row image when it has one."""
        return (self.path,) if self.image is None else (self.path, self.image.path)

    @property
    def is_slice(self) -> bool:
        return self.partition is not None or self.modulus is not None

    @property
    def ident(self) -> tuple:
        """What a chain entry stands for: the file (in which store) and which of its rows."""
        return self.partition, self.path, self.modulus, self.residue

    def to_dict(self) -> dict:
        body = asdict(self)
        for name in _SLICE_FIELDS:
            if body[name] is None:
                del body[name]
        if body["file_format"] == FileFormat.OPAQUE:
            del body["file_format"]
        if body["image"] is None:
            del body["image"]
        elif body["image"]["tail"] is None:
            del body["image"]["tail"]
        return body


_SLICE_FIELDS = ("partition", "modulus", "residue")


@dataclass(frozen=True)
class Manifest:
    version: int
    max_parallelism: int
    files: tuple[FileEntry, ...]
    rows: int | None            # keys of the state at this version; None when unknown (module docstring)
    #: identity of this version's content: a re-commit gets a new one; a shim checks it before building on it
    commit_id: str = field(default_factory=lambda: secrets.token_hex(8))
    #: Spark's query id (``<checkpointLocation>/metadata``): the timeline this version belongs to
    query_id: str | None = None
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    format: int = -1   # set from the files: the lowest ManifestFormat that describes them

    def __post_init__(self):
        if self.format == -1:
            object.__setattr__(self, "format", format_of(self.files))

    @property
    def paths(self) -> list[str]:
        """Paths of the files in this store, row images included (a slice of another store's file is not one)."""
        return [p for f in self.files if f.partition is None for p in f.paths]

    @property
    def deltas_since_snapshot(self) -> int:
        return sum(1 for f in self.files if f.kind == DELTA)

    def to_json(self) -> bytes:
        body = asdict(self)
        body["files"] = [f.to_dict() for f in self.files]
        return _dump(body)

    @classmethod
    def from_json(cls, data: bytes, name: str) -> "Manifest":
        """Parses and verifies a manifest; `name` says which file in error messages."""
        body = _load(data, f"manifest {name}")
        try:
            files = tuple(FileEntry.from_dict(f) for f in body.pop("files"))
            return cls(files=files, **body)
        except (TypeError, KeyError, AttributeError, ValueError) as err:
            raise ChecksumMismatch(f"manifest {name} has unexpected fields ({err}).") from None


@dataclass(frozen=True)
class CompactionRecord:
    """``chk-N/_snapshot``: version N's state as one snapshot file, written by background compaction.

    It is valid only while manifest N still has ``commit_id`` (a re-commit of N
    makes it stale). Compaction writes this record instead of rewriting the
    manifest, so every file a manifest names stays referenced while its version
    is kept, and a commit in flight never loses a file it builds on.
    """

    version: int
    commit_id: str
    snapshot: FileEntry
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    format: int = -1

    def __post_init__(self):
        if self.format == -1:
            object.__setattr__(self, "format", format_of((self.snapshot,)))

    def to_json(self) -> bytes:
        body = asdict(self)
        body["snapshot"] = self.snapshot.to_dict()
        return _dump(body)

    @classmethod
    def from_json(cls, data: bytes, name: str) -> "CompactionRecord":
        body = _load(data, f"compaction record {name}")
        try:
            return cls(snapshot=FileEntry.from_dict(body.pop("snapshot")), **body)
        except (TypeError, KeyError, AttributeError, ValueError) as err:
            raise ChecksumMismatch(f"compaction record {name} has unexpected fields ({err}).") from None


def format_of(files) -> ManifestFormat:
    """The lowest manifest format that can describe `files` (older readers refuse what they cannot read)."""
    if any(f.image is not None and f.image.tail is not None for f in files):
        return ManifestFormat.TAILED
    if any(f.image is not None for f in files):
        return ManifestFormat.IMAGED
    if any(f.typed for f in files):
        return ManifestFormat.TYPED
    return ManifestFormat.SLICED if any(f.is_slice for f in files) else ManifestFormat.PLAIN


def _dump(body: dict) -> bytes:
    body["checksum"] = _body_crc(body)
    return json.dumps(body, indent=1, sort_keys=True).encode()


def _load(data: bytes, what: str) -> dict:
    """Parses a JSON record and checks its format version and its own CRC."""
    try:
        body = json.loads(data)
        fmt = body["format"]
    except (ValueError, TypeError, KeyError, RecursionError):   # RecursionError: JSON nested too deep
        raise ChecksumMismatch(f"{what} is not valid JSON or lacks its format; it is corrupted or truncated.") from None
    if not isinstance(fmt, int) or fmt > NEWEST_MANIFEST_FORMAT:
        raise FormatVersionError(
            f"{what} has format version {fmt}, newer than the {int(NEWEST_MANIFEST_FORMAT)} this spark_state "
            f"reads; it was written by a newer spark_state. Upgrade spark_state on the executors (or restore "
            f"with the version that wrote the checkpoint)."
        )
    recorded = body.pop("checksum", None)
    if recorded != _body_crc(body):
        raise ChecksumMismatch(f"{what} does not match its own checksum; it is corrupted or was edited.")
    return body


def _body_crc(body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return f"crc32:{zlib.crc32(canonical):08x}"
