"""Locations as fsspec URLs: what Spark (Hadoop paths) and users (paths, URLs) give, normalised once."""

from __future__ import annotations

import os
import re

from spark_state.errors import StorageError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$")


def normalize_url(url: str) -> str:
    """Hadoop-style locations to fsspec URLs: 'file:/x' and '/x' -> 'file:///x'; others unchanged.

    Hadoop's ``Path.toUri`` writes local paths as ``file:/x`` (one slash),
    which fsspec would read as a relative path.
    """
    text = str(url).strip()
    if not text:
        raise StorageError("empty checkpoint location; Spark passed no state directory for this store.")
    if text.startswith("/"):
        return "file://" + "/" + text.lstrip("/")
    m = _SCHEME.match(text)
    if not m or len(m.group(1)) == 1:  # 'C:\\x' is a Windows drive, not a scheme
        raise StorageError(
            f"checkpoint location {url!r} is neither a URL nor an absolute path; use e.g. file:///data/ckpt "
            f"or s3://bucket/path."
        )
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "file":
        if rest.startswith("//"):
            rest = rest[2:]
            if not rest.startswith("/"):  # file://host/x: only the local host is meaningful
                host, _, rest = rest.partition("/")
                if host not in ("", "localhost"):
                    raise StorageError(f"checkpoint location {url!r} names a remote host; use file:///path.")
                rest = "/" + rest
        if not rest.startswith("/"):
            raise StorageError(f"checkpoint location {url!r} is a relative file URL; use file:///absolute/path.")
        return "file:///" + rest.lstrip("/")
    if not rest.startswith("//"):
        raise StorageError(f"checkpoint location {url!r} is malformed; expected {scheme}://...")
    return f"{scheme}:{rest}".rstrip("/") if rest.strip("/") else f"{scheme}:{rest}"


def as_url(text: str) -> str:
    """A user's location as an fsspec URL: relative and absolute local paths become file:// URLs."""
    text = str(text).strip()
    if not text:
        raise StorageError("empty location; give a path or a URL such as file:///data/ckpt or s3://bucket/ckpt.")
    if "://" not in text and not text.startswith("file:"):
        text = os.path.abspath(os.path.expanduser(text))
    return normalize_url(text).rstrip("/") or normalize_url(text)
