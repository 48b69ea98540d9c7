"""One fsspec filesystem per process and options for the async ones (S3, GCS, Azure), whichever thread asks.

fsspec caches its filesystem instances per thread (the thread's id is part of the cache key). The worker
answers each JVM connection on a thread of its own, so a store first opened on a new thread made a new S3
client: its HTTP session (aiobotocore loads the CA certificates into an SSL context, ~30 ms, even for an
``http://`` endpoint), its connections and its first request's set-up, all inside that store's restore; the
storage warm-up, on another thread, had paid for a client nobody used again. An async filesystem used
synchronously runs every call on fsspec's one IO loop, so one instance serves every thread; an instance
bound to a loop of its own (``asynchronous=True``) and every other filesystem are left to fsspec's cache.
"""

from __future__ import annotations

import os
import threading

from fsspec.asyn import AsyncFileSystem
from fsspec.utils import tokenize

_SHARED: dict[str, object] = {}
_LOCK = threading.Lock()

#: Connections one shared S3 client keeps at most (aiobotocore's default is 10): every task, fill and commit
#: of the executor now goes through it, where each thread used to have a client and ten of its own.
S3_POOL_CONNECTIONS = 64


def shared(fs):
    """The process's instance for ``fs``'s class and options: the first one asked for (``fs`` itself then)."""
    if not isinstance(fs, AsyncFileSystem) or getattr(fs, "asynchronous", False):
        return fs
    key = tokenize(type(fs).__module__, type(fs).__qualname__, os.getpid(), fs.storage_args, fs.storage_options)
    with _LOCK:
        return _SHARED.setdefault(key, fs)


def with_pool(protocol: str, storage_options: dict) -> dict:
    """``storage_options`` with room for the executor's concurrent requests on a shared S3 client (a copy; the
    caller's own ``max_pool_connections`` stays)."""
    if protocol not in ("s3", "s3a"):
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    config.setdefault("max_pool_connections", S3_POOL_CONNECTIONS)
    return {**storage_options, "config_kwargs": config}
