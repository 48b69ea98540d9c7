"""Damaged bytes for the fuzzed readers: hypothesis strategies for what storage or a peer can hand a reader
(truncation, bit flips, a length or count overwritten with a huge or wrong value, bytes inserted or cut out),
and the checks every reader must pass on them (a named spark_state error or the very data that was
written; never more memory than a small multiple of the input).

``SPARK_STATE_FUZZ_DEPTH=N`` runs N times the examples of every fuzz test (CI runs depth 1, ~1 minute in
all; ``SPARK_STATE_FUZZ_DEPTH=20 pytest -k fuzz tests/unit tests/worker`` is a deeper run).
"""

from __future__ import annotations

import os
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from spark_state.errors import SparkStateError

DEPTH = max(1, int(os.environ.get("SPARK_STATE_FUZZ_DEPTH", "1")))

#: Values a damaged length or count field takes: the edges of every integer width a format uses.
HUGE = (0, 1, 7, 2**15 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1)


def fuzz_settings(examples: int) -> settings:
    """`examples` examples (times SPARK_STATE_FUZZ_DEPTH), no deadline: a slow example is not a failure,
    a hang is (the run never ends)."""
    return settings(max_examples=examples * DEPTH, deadline=None, derandomize=DEPTH == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Mutation:
    """One damage to a byte string; ``apply`` is deterministic, ``repr`` says what it did (hypothesis prints it)."""

    kind: str
    at: float          # where, as a fraction of the length (so one mutation fits any input)
    arg: int = 0
    width: int = 4
    big_endian: bool = False
    extra: bytes = b""
    back: int = 0

    def apply(self, data: bytes) -> bytes:
        n = len(data)
        pos = min(int(self.at * n), max(n - 1, 0))
        if self.kind == "truncate":
            return data[:pos]
        if self.kind == "flip":
            if not n:
                return data
            out = bytearray(data)
            for i in range(self.arg + 1):   # arg + 1 bits, neighbours when arg > 0 (a burst)
                bit = (pos * 8 + (self.width - 1) * 8 * i + i) % (n * 8)
                out[bit // 8] ^= 1 << (bit % 8)
            return bytes(out)
        if self.kind == "number":   # a length or count field overwritten
            if n < self.width:
                return data
            pos = min(pos, n - self.width)
            value = self.arg % (1 << (8 * self.width))
            packed = value.to_bytes(self.width, "big" if self.big_endian else "little")
            return data[:pos] + packed + data[pos + self.width:]
        if self.kind == "insert":
            return data[:pos] + self.extra + data[pos:]
        if self.kind == "cut":
            return data[:pos] + data[pos + self.arg:]
        if self.kind == "tail":   # a number `back` bytes before the end: trailers and indexes sit there
            pos = max(n - self.back - self.width, 0)
            return Mutation("number", pos / n if n else 0.0, self.arg, self.width, self.big_endian).apply(data)
        raise ValueError(self.kind)


_fraction = st.floats(0, 1, allow_nan=False)
_huge = st.sampled_from(HUGE) | st.integers(0, 2**64 - 1)

mutations = st.one_of(
    st.builds(Mutation, st.just("truncate"), _fraction),
    st.builds(Mutation, st.just("flip"), _fraction, st.integers(0, 2), st.sampled_from([1, 2, 8])),
    st.builds(Mutation, st.just("number"), _fraction, _huge, st.sampled_from([1, 2, 4, 8]), st.booleans()),
    st.builds(Mutation, st.just("insert"), _fraction, extra=st.binary(min_size=1, max_size=16)),
    st.builds(Mutation, st.just("cut"), _fraction, st.integers(1, 64)),
)
"""Any damage to a byte string."""

flips = st.builds(Mutation, st.just("flip"), _fraction, st.integers(0, 2), st.sampled_from([1, 2, 8]))
"""Only bit flips (1 to 3 bits): what a checksum must always catch."""


def numbers_near_end(size: int):
    """A length or count overwritten within the last `size` bytes (a trailer, an index)."""
    return st.builds(Mutation, st.just("tail"), st.just(0.0), _huge, st.sampled_from([1, 4, 8]), st.booleans(),
                     back=st.integers(0, size))


#: Memory a reader may take for damaged input: this much plus a multiple of the input's size.
ALLOWED_BASE = 32 * 1024 * 1024
ALLOWED_FACTOR = 64


_POOLS: list = []


@contextmanager
def bounded_memory(input_size: int):
    """Fails when the block allocates far more than the input's size: Python objects and numpy arrays
    (tracemalloc) plus Arrow's buffers (a proxy of the default pool, installed for the block)."""
    limit = ALLOWED_BASE + ALLOWED_FACTOR * input_size
    base = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(base)
    _POOLS.append(pool)   # never freed: Arrow may keep a buffer of it in a global cache
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        pa.set_memory_pool(base)
    arrow_peak = pool.max_memory() or 0
    assert peak + arrow_peak <= limit, (
        f"reading {input_size} damaged bytes allocated {peak} bytes (Python) + {arrow_peak} (Arrow), "
        f"over the {limit} allowed")


def read_damaged(read, data: bytes, expected=None, *, equal=lambda a, b: a == b):
    """Runs `read(data)` on damaged bytes: it must raise a spark_state error or return what the intact
    bytes hold (`expected`; None: any result is acceptable, for readers that have nothing to check against).
    Returns the error (or None)."""
    with bounded_memory(len(data)):
        try:
            got = read(data)
        except SparkStateError as err:
            return err
    if expected is not None:
        assert equal(got, expected), "damaged bytes were read as different data without an error"
    return None
