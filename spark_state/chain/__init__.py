"""One store's version chain: what the worker commits, loads, compacts and retains.

``VersionedStore`` (``store.py``) is the facade; behind it ``reader`` (every
read: manifests, records, chains, data files), ``commit``, ``compaction`` and
``retention`` each hold one concern and share only ``StoreContext``
(``context.py``: where the store is, its settings, this process's locks and
pins). ``merge`` folds a chain into a state, ``rowkeys`` compares typed keys,
``references`` tracks files other stores' manifests name after a rescale,
``history`` reads back the changes each version's commit recorded (Spark's
change feed, snapshot replay, ``read_changes``), and ``registry`` opens stores
(one factory, for the worker and the tools).
docs/consistency.md has the rules every part keeps.
"""

from spark_state.chain.merge import merge_chain
from spark_state.chain.registry import forget_stores, open_store
from spark_state.chain.store import UNCHECKED, CommitResult, Loaded, VersionedStore

__all__ = ["CommitResult", "Loaded", "UNCHECKED", "VersionedStore", "forget_stores", "merge_chain", "open_store"]
