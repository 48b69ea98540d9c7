"""A checkpoint's identity: the query id Spark keeps in ``<checkpointLocation>/metadata``.

A running query's tasks tell the shim its id (the task's local property
``sql.streaming.queryId``); readers without a query (Spark's ``statestore``
source, Python tools) find it here. Deleting a checkpoint and starting the
query again at the same path gives it a new id, which is how spark_state tells
the two timelines apart.
"""

from __future__ import annotations

import json
import logging

import fsspec

from spark_state.storage import normalize_url

log = logging.getLogger(__name__)


def query_id_of(spark_root: str) -> str | None:
    """The query id of the checkpoint whose state directory is `spark_root`, or None if it has none."""
    try:
        state_dir = normalize_url(spark_root).rstrip("/")
    except Exception:  # noqa: BLE001 - not a location we can read: no identity
        return None
    if not state_dir.endswith("/state"):
        return None
    url = state_dir[: -len("/state")] + "/metadata"
    try:
        with fsspec.open(url, "rb") as f:
            data = f.read()
    except (FileNotFoundError, OSError, ValueError):
        return None
    for line in data.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                qid = json.loads(line).get("id")
            except ValueError:
                return None
            return str(qid) if qid else None
    return None
