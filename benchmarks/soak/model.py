"""What the soak's queries must output and keep as state, computed from the input alone (plain Python).

Every expectation is independent of how Spark cut the input into micro-batches
(inputs.py says why), so faults, retries, restarts, rescales and restores may
change when a row comes out but never which rows come out, or how often.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from benchmarks.soak.inputs import TIMEOUT_MS, Shape, events, orders, payments


@dataclass
class Model:
    seed: int
    shape: Shape
    ticks: int
    #: key -> ticks with that key, and its (total, n) after each of them
    _agg: dict = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self):
        totals: dict[str, tuple[int, int]] = {}
        self.sessions: dict[str, list[int]] = {}          # s -> [total, n, last event ms]
        self.distinct: set[tuple[str, int]] = set()
        self.left: set[tuple[str, int]] = set()
        self.right: set[tuple[str, int, int]] = set()
        for tick in range(self.ticks):
            touched = set()
            for r in events(self.seed, tick, self.shape):
                total, n = totals.get(r["k"], (0, 0))
                totals[r["k"]] = (total + r["v"], n + 1)
                touched.add(r["k"])
                s = self.sessions.setdefault(r["s"], [0, 0, 0])
                s[0] += r["v"]
                s[1] += 1
                s[2] = max(s[2], r["t"])
                self.distinct.add((r["id"], r["t"]))
            for k in touched:
                self._agg[k].append((tick, *totals[k]))
            self.left.update((o["oid"], o["lt"]) for o in orders(tick, self.shape))
            self.right.update((p["roid"], p["rt"], p["amount"]) for p in payments(self.seed, tick, self.shape))
        self.totals = totals

    # ------------------------------------------------------------ aggregation: groupBy(k) sum, count, max(g)

    def agg_row_ok(self, k: str, total: int, n: int, max_tick: int) -> bool:
        """An output row is right iff it holds k's totals over every tick up to the last tick with k."""
        history = self._agg.get(k, [])
        i = bisect.bisect_left(history, (max_tick,))
        return i < len(history) and history[i] == (max_tick, total, n)

    def agg_latest(self) -> dict[str, tuple[int, int, int]]:
        return {k: (h[-1][1], h[-1][2], h[-1][0]) for k, h in self._agg.items()}

    # ------------------------------------------------------------ sessions: applyInPandasWithState, event-time timeout

    def sessions_closed(self, watermark_ms: int) -> set[tuple]:
        """(s, total, n, last ms) of the sessions whose timeout the final watermark passed."""
        return {(s, *v) for s, v in self.sessions.items() if v[2] + TIMEOUT_MS < watermark_ms}

    def sessions_open(self, watermark_ms: int) -> set[tuple]:
        return {(s, *v) for s, v in self.sessions.items() if v[2] + TIMEOUT_MS >= watermark_ms}

    # ------------------------------------------------------------ dropDuplicates(id, t) with watermark

    def dedup_kept(self, watermark_ms: int) -> set[tuple[str, int]]:
        """The rows the state must still hold: those the watermark has not passed."""
        return {r for r in self.distinct if r[1] > watermark_ms}

    # ------------------------------------------------------------ stream-stream inner join

    def joined(self) -> set[tuple]:
        """(oid, lt, rt, amount) for every order whose payment was written."""
        lt = dict(self.left)
        return {(oid, lt[oid], rt, amount) for oid, rt, amount in self.right if oid in lt}
