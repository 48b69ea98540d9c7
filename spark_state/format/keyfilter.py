"""The key filter of row images (format version 2, docs/row-image.md): a Bloom filter over records' hashes.

A lookup of a key a file does not hold (an aggregation's new key, a spill run without it) should read no
block. The filter answers "maybe" or "certainly not" from the record's 32-bit ``hash`` alone (Spark's
Murmur3 of the key; of the prefix for a prefix-scan store), so every layer, in either language, derives
the same bits without reading a key. ``m = 64 * W`` bits in ``W`` little-endian u64 words; ``k`` bits per
hash, from one SplitMix64 finaliser of the unsigned hash (a double hash ``a + i * b`` of its halves),
each mapped into ``[0, m)`` by a multiply-shift (all arithmetic modulo 2**64)::

    z = h + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    a, b = z & 0xFFFFFFFF, (z >> 32) | 1
    bit_i = (((a + i * b) & 0xFFFFFFFF) * m) >> 32          for i in 0 .. k-1

Writers size it at ``BITS_PER_KEY`` bits per record and ``K`` bits per hash: about 0.8% false positives,
never a false negative. Vectorised over numpy uint64 arrays (whose arithmetic wraps, as the spec's does).
"""

from __future__ import annotations

import numpy as np

#: Bits of filter per record and bits set per hash (docs/row-image.md, "Format version 2").
BITS_PER_KEY = 10
K = 7
MAX_K = 30

_U64 = np.uint64
_GOLDEN, _MIX1, _MIX2 = _U64(0x9E3779B97F4A7C15), _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_LOW32 = _U64(0xFFFFFFFF)
#: Hashes whose bits are computed at once: bounds the temporaries (a few uint64 arrays of this length).
_STEP = 1 << 16


def words_for(records: int) -> int:
    """Filter words a writer gives a file of `records` records: ``max(1, ceil(10 * records / 64))``."""
    return max(1, -(-BITS_PER_KEY * records // 64))


def _unsigned(hashes) -> np.ndarray:
    """Hashes (int32 as Spark has them, or already unsigned) as uint64 in [0, 2**32)."""
    return (np.asarray(hashes).astype(np.int64, copy=False) & 0xFFFFFFFF).astype(np.uint64)


def _halves(hashes) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of each hash: the halves of its SplitMix64 finaliser, b odd."""
    z = np.atleast_1d(_unsigned(hashes))
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> _U64(30))) * _MIX1
        z = (z ^ (z >> _U64(27))) * _MIX2
        z = z ^ (z >> _U64(31))
    return z & _LOW32, (z >> _U64(32)) | _U64(1)


def _bits(a: np.ndarray, b: np.ndarray, i: int, m: int) -> np.ndarray:
    """Bit `i` of each hash (of halves a, b) in a filter of `m` bits."""
    with np.errstate(over="ignore"):
        return (((a + _U64(i) * b) & _LOW32) * _U64(m)) >> _U64(32)


def positions(hashes, k: int, m: int) -> np.ndarray:
    """The `k` bit positions of each hash in a filter of `m` bits: an array (len(hashes), k) of uint64."""
    a, b = _halves(hashes)
    return np.stack([_bits(a, b, i, m) for i in range(k)], axis=1) if len(a) else np.zeros((0, k), np.uint64)


class KeyFilter:
    """A Bloom filter of ``len(words) * 64`` bits and `k` bits per hash (see the module docstring)."""

    def __init__(self, words: np.ndarray, k: int):
        if not 1 <= k <= MAX_K or len(words) < 1:
            raise ValueError(f"a key filter needs 1..{MAX_K} bits per key and at least one word, got k={k}, "
                             f"{len(words)} words")
        self.words = np.asarray(words, dtype="<u8")
        self.k = k
        self.m = 64 * len(self.words)

    @classmethod
    def of(cls, hashes, records: int | None = None, k: int = K) -> "KeyFilter":
        """The filter a writer makes for a file holding these hashes (``records``: how many the file holds,
        default ``len(hashes)``; equal hashes set the same bits)."""
        builder = FilterBuilder(len(np.atleast_1d(hashes)) if records is None else records, k)
        builder.add(hashes)
        return builder.finish()

    def might_contain(self, hashes):
        """Whether a key of each hash may be in the file (False: certainly not). A scalar for a scalar."""
        flat = np.atleast_1d(hashes)
        found = np.ones(len(flat), dtype=bool)
        for start in range(0, len(flat), _STEP):
            a, b = _halves(flat[start:start + _STEP])
            part = found[start:start + _STEP]
            for i in range(self.k):
                bit = _bits(a, b, i, self.m)
                part &= ((self.words[(bit >> _U64(6)).astype(np.intp)] >> (bit & _U64(63))) & _U64(1)).astype(bool)
        return bool(found[0]) if np.ndim(hashes) == 0 else found

    def to_bytes(self) -> bytes:
        return self.words.tobytes()

    @property
    def fill(self) -> float:
        """The share of bits set (about half at the writers' sizing); a test's and a reader's sanity figure."""
        return int(np.unpackbits(self.words.view(np.uint8)).sum()) / self.m


class FilterBuilder:
    """Builds a writer's filter from hashes given in any number of parts (an image written chunk by chunk).

    It sets the bits straight in the packed words (``np.bitwise_or.at``): 1.25 bytes per record while
    building, as once finished. A byte per bit set by fancy indexing was twice as fast, but 10 bytes per
    record are the largest thing a compaction holds at its end: 75 MB for a 7.5M-row partition, the
    worker's peak (docs/large-state.md)."""

    def __init__(self, records: int, k: int = K):
        self.k = k
        self.m = 64 * words_for(records)
        self._words = np.zeros(self.m // 64, dtype="<u8")

    def add(self, hashes) -> None:
        flat = np.atleast_1d(hashes)
        for start in range(0, len(flat), _STEP):
            a, b = _halves(flat[start:start + _STEP])
            for i in range(self.k):
                bit = _bits(a, b, i, self.m)
                np.bitwise_or.at(self._words, (bit >> _U64(6)).astype(np.intp), _U64(1) << (bit & _U64(63)))

    def finish(self) -> KeyFilter:
        return KeyFilter(self._words, self.k)
