"""Opening stores: the one factory of VersionedStores, and the worker's cache of them with idle eviction."""

from __future__ import annotations

import threading
import time

from spark_state.chain.store import VersionedStore
from spark_state.options import Settings
from spark_state.storage import storage_for
from spark_state.storage.base import CheckpointStorage
from spark_state.storage.layout import StoreRef, resolve_root

#: A cached store unused this long is dropped (a long-lived worker sees many queries come and go).
STORE_IDLE_SECONDS = 600.0

_STORES: dict[tuple[str, str, str | None], VersionedStore] = {}
_STORES_LOCK = threading.Lock()


def open_store(ref: StoreRef, settings: Settings, *, cached: bool = True) -> VersionedStore:
    """The VersionedStore of `ref`: the one factory of stores, for the worker and the offline tools.

    The root is `ref.location` as an fsspec URL when settings.checkpoint_root
    is None, else under checkpoint_root, keyed by the query's state directory
    and its query id (see spark_state.storage.layout.resolve_root). A rescaled
    chain names files of other partitions' stores: the store reads them as
    siblings of `ref`.

    ``cached`` (the worker): one store per (resolved root, storage kind, query
    id) in this process, so its pins, locks and grace clock are shared by every
    request; two timelines (a deleted and re-created checkpoint, another query)
    never share one. The newest settings win (they come with every request).
    Uncached (the tools): a new store, that sees only what storage holds.
    """
    if not cached:
        return _new_store(ref, settings, resolve_root(ref, settings))
    root = resolve_root(ref, settings)
    key = (root, settings.storage, ref.query_id)
    now = time.monotonic()
    with _STORES_LOCK:
        store = _STORES.pop(key, None)
        if store is None:
            store = _new_store(ref, settings, root)
        else:
            store.update_settings(settings)
        store.last_used = now
        _evict_idle(now)
        _STORES[key] = store   # most recently used last
        return store


def _evict_idle(now: float) -> None:
    for key, store in list(_STORES.items()):
        if now - store.last_used < STORE_IDLE_SECONDS:
            break
        if not store.busy():
            del _STORES[key]


def _new_store(ref: StoreRef, settings: Settings, root: str) -> VersionedStore:
    def sibling(partition: int) -> CheckpointStorage:
        return storage_for(ref.sibling(partition), settings)

    return VersionedStore(storage_for(ref, settings), settings,
                          name=f"{root} (operator {ref.operator}, partition {ref.partition}, {ref.name})",
                          query_id=ref.query_id, partition=ref.partition, siblings=sibling)


def forget_stores() -> None:
    """Drops the cached stores (tests; a new worker process starts with none)."""
    with _STORES_LOCK:
        _STORES.clear()
