"""Key groups: the unit in which state is partitioned, stored and rescaled.

Spark routes a grouping key with hash ``h`` (Murmur3, seed 42, as int32) to
partition ``pmod(h, N)``. We store ``h`` with every row and cut the state into
``M`` key groups, ``kg = pmod(h, M)``, M being the max parallelism, fixed for
the life of a checkpoint. Because ``pmod(h, M) % N == pmod(h, N)`` whenever
``N`` divides ``M``, partition ``p`` of ``N`` owns exactly the key groups with
``kg % N == p``: a strided set, unlike Flink's contiguous ``KeyGroupRange``
(Spark's routing is a modulo, Flink's is a range split), but with the same
use: a restore with another partition count reads whole key groups by offset.

When a new count ``N'`` does not divide ``M``, key groups no longer decide the
partition on their own; a reader then reads the key groups that *can* hold its
rows (``kg ≡ p' mod gcd(M, N')``) and filters them by the stored hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Iterable

import numpy as np
import pyarrow as pa

from spark_state.errors import MaxParallelismChanged, OptionError
from spark_state.options import MAX_MAX_PARALLELISM, PREFIX

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------- validation

def check_max_parallelism(max_parallelism: int) -> int:
    """Returns M if it is a usable max parallelism, else raises OptionError."""
    if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, (int, np.integer)):
        raise OptionError(f"{PREFIX}maxParallelism={max_parallelism!r} is not an integer.")
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise OptionError(
            f"{PREFIX}maxParallelism={max_parallelism} is out of range; use an integer in [1, {MAX_MAX_PARALLELISM}]."
        )
    return int(max_parallelism)


def check_partition(partition: int, num_partitions: int) -> None:
    """Raises ValueError unless 0 <= partition < num_partitions."""
    if num_partitions < 1:
        raise ValueError(f"number of partitions must be >= 1, got {num_partitions}")
    if not 0 <= partition < num_partitions:
        raise ValueError(f"partition {partition} is outside [0, {num_partitions})")


def check_same_max_parallelism(recorded: int, configured: int, where: str) -> None:
    """M is fixed per checkpoint: a different configured M would re-route every key."""
    if recorded != configured:
        raise MaxParallelismChanged(
            f"{where} was written with max parallelism {recorded}, but the query sets {configured}. "
            f"The max parallelism is fixed for the life of a checkpoint: set {PREFIX}maxParallelism={recorded} "
            f"to keep using this checkpoint, or start the query from a new checkpointLocation."
        )


# ---------------------------------------------------------------- scalar math

def key_group(h: int, max_parallelism: int) -> int:
    """pmod(h, M): the key group of one hash (Python's % is already non-negative for M > 0)."""
    return h % max_parallelism


def partition_of(h: int, num_partitions: int) -> int:
    """pmod(h, N): the partition Spark's HashPartitioning routes a hash to."""
    return h % num_partitions


def divides(num_partitions: int, max_parallelism: int) -> bool:
    return max_parallelism % num_partitions == 0


# ---------------------------------------------------------------- vectorised

def _int64(hashes) -> np.ndarray:
    if isinstance(hashes, (pa.ChunkedArray, pa.Array)):
        hashes = hashes.to_numpy(zero_copy_only=False)
    return np.asarray(hashes, dtype=np.int64)


def key_group_order(kg) -> np.ndarray:
    """The stable order of rows by key group: ``np.argsort(kg, kind="stable")``, ~6x faster.

    Key groups are non-negative int32, so each row's (key group, row number) fits one unsigned 64-bit
    integer; those are unique, so numpy's (SIMD) unstable sort of them yields the stable order.
    """
    kg = np.asarray(kg)
    if len(kg) and kg.min() < 0:   # not a key group (pmod is never negative): keep argsort's meaning
        return np.argsort(kg, kind="stable")
    packed = kg.astype(np.uint64) << np.uint64(32)
    packed |= np.arange(len(kg), dtype=np.uint64)
    packed.sort()
    return (packed & np.uint64(0xFFFFFFFF)).astype(np.intp)


def key_groups_of(hashes, max_parallelism: int) -> np.ndarray:
    """Vectorised pmod(h, M) for a column of hashes, as int32 (np.mod follows the divisor's sign)."""
    return np.mod(_int64(hashes), max_parallelism).astype(np.int32)


def partitions_of(hashes, num_partitions: int) -> np.ndarray:
    """Vectorised pmod(h, N) for a column of hashes, as int32."""
    return np.mod(_int64(hashes), num_partitions).astype(np.int32)


def owned_key_groups(partition: int, num_partitions: int, max_parallelism: int) -> np.ndarray:
    """The key groups partition p of N owns, for N dividing M: kg with kg % N == p."""
    check_partition(partition, num_partitions)
    if not divides(num_partitions, max_parallelism):
        raise ValueError(
            f"{num_partitions} partitions do not divide max parallelism {max_parallelism}; "
            f"ownership is then decided per row by hash (see read_plan)."
        )
    return np.arange(partition, max_parallelism, num_partitions, dtype=np.int32)


@dataclass(frozen=True)
class SourceRead:
    """What to read from one old partition: these key groups (sorted int32)."""

    partition: int
    key_groups: np.ndarray


@dataclass(frozen=True)
class ReadPlan:
    """How new partition p' of N' rebuilds its state from a checkpoint written with N partitions.

    ``filter_by_hash`` is set when N' does not divide M: the listed key groups
    may then also hold rows of other new partitions, and the reader keeps the
    rows with pmod(hash, N') == p' (``filter_rows``).
    """

    partition: int
    num_partitions: int
    max_parallelism: int
    sources: tuple[SourceRead, ...]
    filter_by_hash: bool


def read_plan(partition: int, num_partitions: int, old_num_partitions: int, max_parallelism: int) -> ReadPlan:
    """The old partitions and key groups new partition p' of N' must read.

    Old partition p holds hashes with h ≡ p (mod N); p' wants h ≡ p' (mod N');
    both can hold only if p ≡ p' (mod gcd(N, N')). In key-group terms, old p
    holds kg ≡ p (mod gcd(M, N)) and p' needs kg ≡ p' (mod gcd(M, N')); when N'
    divides M the second condition is exact and no row filter is needed.
    """
    check_max_parallelism(max_parallelism)
    check_partition(partition, num_partitions)
    if old_num_partitions < 1:
        raise ValueError(f"old number of partitions must be >= 1, got {old_num_partitions}")
    m = max_parallelism
    g_new = gcd(m, num_partitions)
    g_old = gcd(m, old_num_partitions)
    wanted = np.arange(partition % g_new, m, g_new, dtype=np.int64)
    g_parts = gcd(old_num_partitions, num_partitions)
    sources = []
    for p in range(partition % g_parts, old_num_partitions, g_parts):
        kgs = wanted[wanted % g_old == p % g_old].astype(np.int32)
        if len(kgs):
            sources.append(SourceRead(p, kgs))
    return ReadPlan(partition, num_partitions, m, tuple(sources), not divides(num_partitions, m))


def filter_rows(table: pa.Table, partition: int, num_partitions: int) -> pa.Table:
    """Rows of `table` (with an int32 'hash' column) that Spark routes to partition p of N."""
    check_partition(partition, num_partitions)
    mask = partitions_of(table.column("hash"), num_partitions) == partition
    return table.filter(pa.array(mask))


def as_key_group_array(key_groups: Iterable[int] | np.ndarray, max_parallelism: int) -> np.ndarray:
    """Normalises a caller's key-group selection to sorted unique int32, rejecting out-of-range ids."""
    if isinstance(key_groups, (pa.Array, pa.ChunkedArray)):
        key_groups = key_groups.to_numpy(zero_copy_only=False)
    elif not isinstance(key_groups, np.ndarray):
        key_groups = list(key_groups)
    arr = np.unique(np.asarray(key_groups, dtype=np.int64))
    if len(arr) and (arr[0] < 0 or arr[-1] >= max_parallelism):
        bad = arr[0] if arr[0] < 0 else arr[-1]
        raise ValueError(f"key group {bad} is outside [0, {max_parallelism}) for max parallelism {max_parallelism}")
    return arr.astype(np.int32)


# ---------------------------------------------------------------- slices (metadata-only rescale)

def combine_residues(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None | bool:
    """The hashes that satisfy both ``h ≡ r1 (mod n1)`` and ``h ≡ r2 (mod n2)``, as one (modulus, residue).

    Chinese remainder theorem: the two hold together exactly when
    ``r1 ≡ r2 (mod gcd(n1, n2))``, and then for one residue modulo
    ``lcm(n1, n2)``. None stands for "every hash"; the result is False when no
    hash satisfies both (a slice of a slice that is empty).
    """
    if a is None:
        return b
    if b is None:
        return a
    (n1, r1), (n2, r2) = a, b
    g = gcd(n1, n2)
    if (r1 - r2) % g:
        return False
    lcm = n1 // g * n2
    # r = r1 + n1 * t with n1 * t ≡ r2 - r1 (mod n2): t = ((r2 - r1) / g) * inv(n1 / g) mod (n2 / g)
    m = n2 // g
    t = ((r2 - r1) // g * pow(n1 // g, -1, m)) % m if m > 1 else 0
    return lcm, (r1 + n1 * t) % lcm


def slice_key_groups(modulus: int, residue: int, max_parallelism: int) -> tuple[np.ndarray, bool]:
    """(key groups that can hold hashes ≡ residue mod modulus, whether rows must also be filtered by hash).

    ``kg = pmod(h, M)`` determines ``h mod gcd(M, modulus)``, so the key
    groups with ``kg ≡ residue (mod g)`` are the only candidates; when the
    modulus divides M they are exact and no row filter is needed.
    """
    g = gcd(max_parallelism, modulus)
    return np.arange(residue % g, max_parallelism, g, dtype=np.int32), g != modulus


def filter_residue(table: pa.Table, modulus: int, residue: int) -> pa.Table:
    """Rows of `table` whose pmod(hash, modulus) == residue."""
    mask = np.mod(_int64(table.column("hash")), modulus) == residue
    return table.filter(pa.array(mask))
