"""Spark's own checkpoint files, as far as spark_state reads or writes them.

Facts from Spark 4.3 (``HDFSMetadataLog`` and its subclasses):

- ``offsets/<batch>``: a version line (``v1``, or ``v2`` for the opt-in
  ``OffsetMap`` format), a JSON line of ``OffsetSeqMetadata`` (watermark,
  timestamp and the SQL confs pinned for the query's life, among them
  ``spark.sql.shuffle.partitions`` and, where set, the internal
  ``spark.sql.streaming.internal.stateStore.partitions``), then one line per
  source: its offset as JSON, ``-`` for none (v2: ``<sourceId>:<offset>``).
  Spark restores those confs from the latest entry on restart, which is how
  a rescale changes the partition count.
- ``commits/<batch>``: ``v1`` then a JSON line (``nextBatchWatermarkMs``).
- ``sources/<i>/<n>`` (and compacted ``<n>.compact``): the source's own log;
  for the file source ``<n>`` is its ``logOffset``, not the query's batch.
- ``metadata``: one JSON object, ``{"id": <query id>}``, written when the
  checkpoint is created. The query id is the checkpoint's identity: a
  deleted checkpoint started again at the same path gets a new one, which is
  how spark_state tells the two timelines apart (docs/consistency.md, rule 1).
  A running query's tasks tell the shim the id; readers without a query
  (Spark's ``statestore`` source, the tools) read it here (``read_query_id``).
- ``state/<op>/_metadata/metadata``: operator metadata v1, ``v1`` then a JSON
  line naming the operator, its stores and their partition count.

Files are parsed line-wise and written back with every line we do not change
kept byte for byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from spark_state.errors import CheckpointError, SparkStateError

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
STATE_PARTITIONS = "spark.sql.streaming.internal.stateStore.partitions"
PROVIDER_CLASS_CONF = "spark.sql.streaming.stateStore.providerClass"

_BATCH_FILE = re.compile(r"^(\d+)(\.compact)?$")


def batch_of(name: str) -> int | None:
    """The batch id of a log file name ('7', '9.compact'); None for anything else (.crc, temp files)."""
    m = _BATCH_FILE.match(name)
    return int(m.group(1)) if m else None


def _lines(data: bytes, name: str) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{name} is not UTF-8 text; it is not a Spark checkpoint file or it is corrupted.") from None
    return text.split("\n")


def _version(line: str, name: str, supported: tuple[int, ...]) -> int:
    m = re.fullmatch(r"v(\d+)", line.strip())
    if not m:
        raise CheckpointError(f"{name} does not start with a log version line like 'v1'; it is corrupted or "
                              f"not a Spark checkpoint file.")
    version = int(m.group(1))
    if version not in supported:
        raise CheckpointError(f"{name} has log format v{version}; spark_state reads "
                              f"{', '.join(f'v{v}' for v in supported)} (Spark 4.3).")
    return version


def _json(line: str, name: str) -> dict:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):   # RecursionError: JSON nested too deep
        raise CheckpointError(f"{name} holds a line that is not JSON; it is corrupted or truncated.") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{name} holds JSON that is not an object; it is corrupted.")
    return value


@dataclass(frozen=True)
class OffsetSeq:
    """One ``offsets/<batch>`` entry: its metadata (confs) and the sources' offset lines, verbatim."""

    version: int
    metadata: dict | None
    offsets: tuple[str, ...]

    @classmethod
    def parse(cls, data: bytes, name: str) -> "OffsetSeq":
        lines = _lines(data, name)
        version = _version(lines[0], name, (1, 2))
        if len(lines) < 2:
            raise CheckpointError(f"{name} ends after its version line; it is truncated.")
        meta = lines[1].strip()
        return cls(version, _json(meta, name) if meta else None, tuple(lines[2:]))

    @property
    def conf(self) -> dict[str, str]:
        return dict((self.metadata or {}).get("conf") or {})

    def with_conf(self, updates: dict[str, str]) -> "OffsetSeq":
        if self.metadata is None:
            raise CheckpointError("this offset log entry has no metadata (written by Spark before 2.1); "
                                  "run the query once with a current Spark first.")
        metadata = dict(self.metadata)
        metadata["conf"] = {**self.conf, **updates}
        return replace(self, metadata=metadata)

    def source_offset(self, index: int) -> dict | None:
        """The offset JSON of the index-th source (v1 layout), None when absent or not an object."""
        if self.version != 1 or index >= len(self.offsets):
            return None
        line = self.offsets[index].strip()
        if line in ("", "-"):
            return None
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    def to_bytes(self) -> bytes:
        meta = "" if self.metadata is None else json.dumps(self.metadata, separators=(",", ":"))
        return "\n".join([f"v{self.version}", meta, *self.offsets]).encode()


def parse_commit(data: bytes, name: str) -> dict:
    """A commit log entry's JSON: ``nextBatchWatermarkMs``; with checkpoint format v2 (log format v2) also
    ``stateUniqueIds``, operator id -> partition -> the checkpoint id of each of its stores."""
    lines = _lines(data, name)
    _version(lines[0], name, (1, 2))
    return _json(lines[1], name) if len(lines) > 1 and lines[1].strip() else {}


def parse_query_id(data: bytes, name: str) -> str:
    """The query id in the bytes of a ``metadata`` file; CheckpointError when there is none."""
    meta = _json(b"".join(data.splitlines()).decode("utf-8", "replace"), name)
    query_id = meta.get("id")
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointError(f"{name} has no query id; it is corrupted.")
    return query_id


def read_query_id(spark_root: str) -> str | None:
    """The query id of the checkpoint whose state directory is `spark_root` (what Spark hands the provider),
    or None when it has none that can be read: the lenient reader, for the worker serving a request
    without a query id (a reader, an old shim), which then keys its stores without one."""
    from spark_state.storage.directory import Dir
    from spark_state.storage.urls import normalize_url

    try:
        state_dir = normalize_url(spark_root).rstrip("/")
        if not state_dir.endswith("/state"):
            return None
        checkpoint = Dir(state_dir[: -len("/state")])
        return parse_query_id(checkpoint.read("metadata"), checkpoint.url_of("metadata"))
    except (SparkStateError, OSError, ValueError):
        return None


def query_metadata(query_id: str) -> bytes:
    """The ``metadata`` file Spark writes for a query id."""
    return json.dumps({"id": query_id}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class OperatorMetadata:
    """``state/<op>/_metadata/metadata`` (v1): the operator and its stores with their partition count."""

    operator: int
    name: str
    stores: tuple[str, ...]
    num_partitions: int | None
    raw: dict

    @classmethod
    def parse(cls, data: bytes, name: str) -> "OperatorMetadata":
        lines = _lines(data, name)
        _version(lines[0], name, (1,))
        body = _json(lines[1] if len(lines) > 1 else "", name)
        try:
            info = body["operatorInfo"]
            stores = body["stateStoreInfo"]
            parts = {int(s["numPartitions"]) for s in stores}
            return cls(int(info["operatorId"]), str(info["operatorName"]), tuple(str(s["storeName"]) for s in stores),
                       parts.pop() if len(parts) == 1 else None, body)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{name} is not operator metadata Spark 4.3 wrote; it is corrupted.") from None

    def with_partitions(self, num_partitions: int) -> bytes:
        body = dict(self.raw)
        body["stateStoreInfo"] = [{**s, "numPartitions": num_partitions} for s in self.raw["stateStoreInfo"]]
        return ("v1\n" + json.dumps(body, separators=(",", ":"))).encode()
