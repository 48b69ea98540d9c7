"""Fault injection points for crash tests: off unless ``SPARK_STATE_FAULT_DIR`` is set.

At a named point the worker looks for the file ``$SPARK_STATE_FAULT_DIR/<point>``.
If it is there, the worker claims it by renaming it (so exactly one process
fires each file), reads the action it holds and performs it:

* ``exit``       the process dies on the spot (``os._exit(137)``), as under SIGKILL;
* ``sleep:<s>``  the process sleeps ``s`` seconds, so a test can kill the executor
                 around it at a known moment.

Points: ``stage-after-chunk`` (a chunk of a streamed commit is in its data file,
the reply not sent), ``commit-after-data`` (a commit's data file is written, its
manifest is not), ``commit-after-manifest`` (the manifest is written, the reply not
sent), ``compaction-after-snapshot`` (a compacted snapshot is written, its record is not).
"""

from __future__ import annotations

import itertools
import logging
import os
import time

ENV = "SPARK_STATE_FAULT_DIR"
POINTS = ("stage-after-chunk", "commit-after-data", "commit-after-manifest", "compaction-after-snapshot")

log = logging.getLogger(__name__)
_claims = itertools.count()


def fault(point: str) -> None:
    """Performs the action armed for ``point``, if any (one stat call when the variable is set)."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    armed = os.path.join(directory, point)
    claimed = f"{armed}.fired-{os.getpid()}-{next(_claims)}"
    try:
        os.rename(armed, claimed)
    except OSError:
        return
    with open(claimed) as f:
        action = f.read().strip()
    log.warning("fault injection: %s at %s", action, point)
    if action == "exit":
        os._exit(137)
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
        return
    raise ValueError(f"unknown fault action {action!r} in {armed}; use 'exit' or 'sleep:<seconds>'")
