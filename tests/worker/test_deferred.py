"""The worker's deferred changes (spark_state.worker.deferred): each token is taken once, an unknown token is
None (the shim's request then reads the changes from storage), and changes nobody takes are dropped after
the idle limit without cancelling their read (which unpins the chain's files when it ends)."""

from __future__ import annotations

import time
from concurrent.futures import Future

from spark_state.chain.reader import DeferredChanges
from spark_state.worker.deferred import DeferredRegistry


def done(value) -> DeferredChanges:
    future: Future = Future()
    future.set_result((value, 0))
    return DeferredChanges(future, 0)


def test_a_token_is_taken_once_and_tokens_are_distinct():
    registry = DeferredRegistry()
    a, b = done("a"), done("b")
    ta, tb = registry.put(a), registry.put(b)
    assert ta != tb and len(ta) == 32 and len(registry) == 2
    assert registry.take(tb) is b and registry.take(tb) is None
    assert registry.take("unknown") is None and registry.take(ta) is a and len(registry) == 0


def test_changes_nobody_takes_are_dropped_after_the_idle_limit_and_their_read_goes_on():
    registry = DeferredRegistry(idle_limit=0.05)
    running: Future = Future()
    stale = registry.put(DeferredChanges(running, 1))
    time.sleep(0.1)
    fresh = registry.put(done("fresh"))
    assert registry.take(stale) is None and not running.cancelled()
    assert registry.take(fresh) is not None
    registry.put(done("quiet"))
    time.sleep(0.1)
    registry.sweep()   # every request sweeps: a worker that makes no more deferred loads keeps nothing
    assert len(registry) == 0
