"""One fsspec filesystem per process and options for the async ones (S3, GCS, Azure), whichever thread asks.

The worker answers each JVM connection on a thread of its own. fsspec before 2026.5 cached its filesystem
instances per thread (the thread's id was part of the cache key; fsspec#2028 dropped it for async filesystems
used synchronously): there, a store first opened on a new thread made a new S3 client, with its own HTTP
session (aiobotocore loads the CA certificates into an SSL context, even for an ``http://`` endpoint) and
connections, inside that store's restore, and the storage warm-up's client, made on its own thread, went
unused. An async filesystem used synchronously runs every call on fsspec's one IO loop, so one instance serves
every thread; ``shared`` gives every fsspec the project supports (``fsspec>=2024.6``) the newer behaviour.
An instance bound to a loop of its own (``asynchronous=True``) and every other filesystem are left to fsspec.

One client for the whole worker also means one connection pool: ``with_pool`` sizes it for an executor's
concurrent requests (aiobotocore keeps 10 connections by default; every task's lookups, the image fills and
the commits of an executor share them).
"""

from __future__ import annotations

import os
import threading

import fsspec.config
from fsspec.asyn import AsyncFileSystem
from fsspec.utils import tokenize

_SHARED: dict[str, object] = {}
_LOCK = threading.Lock()

#: Connections the worker's S3 client keeps at most (aiobotocore's default is 10).
S3_POOL_CONNECTIONS = 64


def shared(fs):
    """The process's instance for ``fs``'s class and options: the first one asked for (``fs`` itself then)."""
    if not isinstance(fs, AsyncFileSystem) or getattr(fs, "asynchronous", False):
        return fs
    key = tokenize(type(fs).__module__, type(fs).__qualname__, os.getpid(), fs.storage_args, fs.storage_options)
    with _LOCK:
        return _SHARED.setdefault(key, fs)


def with_pool(protocol: str, storage_options: dict) -> dict:
    """``storage_options`` with room for the executor's concurrent requests on a shared S3 client (a copy). The
    client's other settings stay what fsspec's configuration (its config files, ``FSSPEC_S3_*``) and the caller
    give: an explicit ``config_kwargs`` would otherwise replace the configured one whole."""
    if protocol not in ("s3", "s3a"):
        return storage_options
    given = [(fsspec.config.conf.get(name) or {}).get("config_kwargs") for name in ("s3", "s3a")]
    given.append(storage_options.get("config_kwargs"))
    if any(c is not None and not isinstance(c, dict) for c in given):
        return storage_options   # not a mapping (an INI file's text): s3fs says what is wrong with it
    config = {}
    for c in given:
        config.update(c or {})
    config.setdefault("max_pool_connections", S3_POOL_CONNECTIONS)
    return {**storage_options, "config_kwargs": config}
