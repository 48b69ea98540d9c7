"""The soak's input: one file per stream per tick, each a pure function of (seed, tick).

Because a tick's rows depend on nothing else, the model (model.py) recomputes
every row the queries read without the harness keeping them. Event times are
``tick * 10 s + 1 ms``: ticks never go back in time, so with the queries'
35 s watermark delay no row is ever late, and every expected result is
independent of how Spark cut the input into micro-batches (the watermark
and the timeouts, ``+ 55 s``, never tie with an event time).

Streams:

* ``events``: ``k`` (aggregation key), ``v``, ``s`` (a session key, alive for 6 ticks),
  ``id`` (deduplication key; some rows repeat rows of this or the previous tick), ``t``, ``g`` (tick);
* ``left``: orders ``oid``, ``lt``; ``right``: payments ``roid``, ``rt = lt + 5 s``, ``amount``;
  an order's payment comes in the same tick (even orders) or the next (odd orders).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
EPOCH_MS = int(EPOCH.timestamp() * 1000)
TICK_MS = 10_000
#: Watermark delay of every query, and the event-time timeout after a session's last event.
DELAY_S, TIMEOUT_MS = 35, 55_000

STREAMS = ("events", "left", "right")
SCHEMAS = {
    "events": "k string, v long, s string, id string, t timestamp, g long",
    "left": "oid string, lt timestamp",
    "right": "roid string, rt timestamp, amount long",
}


def tick_ms(tick: int) -> int:
    """Event time of every row of ``tick``, in ms since the Unix epoch."""
    return EPOCH_MS + tick * TICK_MS + 1


def _iso(ms: int) -> str:
    return (datetime.fromtimestamp(ms / 1000, timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(frozen=True)
class Shape:
    """How much input a tick holds."""

    keys: int = 2000          # aggregation keys
    rows: int = 40            # events per tick
    sessions: int = 8         # session keys alive at once
    session_ticks: int = 6    # ticks a session key receives events
    orders: int = 10          # orders per tick


def _base(seed: int, tick: int, shape: Shape) -> list[dict]:
    """The rows of ``tick`` before duplicates are added (what the next tick may repeat)."""
    rng = random.Random(f"{seed}-events-{tick}")
    t = tick_ms(tick)
    return [{"k": f"k{rng.randrange(shape.keys):05d}", "v": rng.randrange(1, 100),
             "s": f"s{tick // shape.session_ticks:06d}-{rng.randrange(shape.sessions)}",
             "id": f"e{tick}-{i}", "t": t, "g": tick} for i in range(shape.rows)]


def events(seed: int, tick: int, shape: Shape) -> list[dict]:
    """A tick's events: its own rows, two of them again, and two rows of the previous tick again (with
    their event time, so never late)."""
    rng = random.Random(f"{seed}-duplicates-{tick}")
    rows = _base(seed, tick, shape)
    rows += [dict(rows[rng.randrange(shape.rows)]) for _ in range(2)]
    if tick > 0:
        before = _base(seed, tick - 1, shape)
        rows += [dict(before[rng.randrange(shape.rows)], g=tick) for _ in range(2)]
    return rows


def orders(tick: int, shape: Shape) -> list[dict]:
    return [{"oid": f"o{tick}-{i}", "lt": tick_ms(tick)} for i in range(shape.orders)]


def payments(seed: int, tick: int, shape: Shape) -> list[dict]:
    """Payments of this tick's even orders and the previous tick's odd ones."""
    rng = random.Random(f"{seed}-payments-{tick}")
    mine = [o for i, o in enumerate(orders(tick, shape)) if i % 2 == 0]
    late = [o for i, o in enumerate(orders(tick - 1, shape)) if i % 2 == 1] if tick > 0 else []
    return [{"roid": o["oid"], "rt": o["lt"] + 5_000, "amount": rng.randrange(1, 1000)} for o in mine + late]


def rows_of(stream: str, seed: int, tick: int, shape: Shape) -> list[dict]:
    if stream == "events":
        return events(seed, tick, shape)
    if stream == "left":
        return orders(tick, shape)
    if stream == "right":
        return payments(seed, tick, shape)
    raise ValueError(f"unknown stream {stream!r}; streams are {STREAMS}")


class InputWriter:
    """Writes tick after tick into ``<root>/<stream>/``: complete files only (temporary name, then rename),
    modification times increasing with the tick (Spark's file source reads files in that order)."""

    def __init__(self, root: Path, seed: int, shape: Shape):
        self.root, self.seed, self.shape = Path(root), seed, shape
        for stream in STREAMS:
            (self.root / stream).mkdir(parents=True, exist_ok=True)
        self.ticks = len(list((self.root / "events").glob("part-*.json")))
        self.base_mtime = 1_700_000_000

    def dir(self, stream: str) -> Path:
        return self.root / stream

    def write_tick(self) -> int:
        tick = self.ticks
        for stream in STREAMS:
            rows = rows_of(stream, self.seed, tick, self.shape)
            name = self.root / stream / f"part-{tick:07d}.json"
            tmp = self.root / stream / f".part-{tick:07d}.json.tmp"
            text = "".join(json.dumps({k: (_iso(v) if k in ("t", "lt", "rt") else v) for k, v in r.items()}) + "\n"
                           for r in rows)
            tmp.write_text(text)
            mtime = self.base_mtime + tick
            os.utime(tmp, (mtime, mtime))
            tmp.rename(name)
        self.ticks += 1
        return tick
