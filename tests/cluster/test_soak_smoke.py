"""A short run of the chaos soak (benchmarks/soak) with every kind of fault, and the soak's end checks.

The soak starts its own world (S3 server, fault proxy, a standalone cluster of two executors and its
own SparkSession), so it runs in a process of its own, beside this session's cluster; its verdict and
figures come back in ``summary.json``. The long run is ``make soak MINUTES=60``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.soak.faults import KINDS
from tests.support.paths import ROOT, pythonpath_with_root

#: Soak time and mean gap between faults; the soak goes on until every kind of fault was performed once, starting
#: with those that stop a query (quick while the queries have no backlog yet).
MINUTES, FAULT_EVERY_S, SEED = 0.5, 1.5, 7


def test_soak_smoke_loses_nothing_under_every_kind_of_fault(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["--minutes", MINUTES, "--fault-every", FAULT_EVERY_S, "--seed", SEED, "--grace", 30, "--orphan-slack", 10,
            "--every-kind", "--first", "rescale,savepoint-restore,query-restart", "--out", out, "--workdir", work,
            "--keep"]
    run = subprocess.run([sys.executable, "-m", "benchmarks.soak", *map(str, args)], cwd=ROOT,
                         env={**_env(), "PYTHONPATH": pythonpath_with_root()}, capture_output=True, text=True,
                         timeout=900)
    log = (out / "soak.log").read_text() if (out / "soak.log").exists() else run.stdout[-3000:]
    assert (out / "summary.json").exists(), f"the soak ended without its end checks ({run.returncode}):\n" \
                                            f"{log}\n{run.stderr[-3000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"], f"the soak found problems: {json.dumps(summary['problems'], indent=1)}\n{log}"
    performed = {f["kind"] for f in summary["faults"] if f["ok"]}
    assert set(KINDS) <= performed, f"fault kinds never performed: {sorted(set(KINDS) - performed)}\n{log}"
    assert not summary["unrecovered"], f"faults after which some query never committed again: " \
                                       f"{summary['unrecovered']}\n{log}"
    for name, q in summary["queries"].items():
        assert q["batches"] > 0 and q["versions_loaded"] > 0, f"{name} ran no batch or kept no version: {q}"
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "results.md").exists() and (out / "soak.png").exists()


def _env() -> dict:
    """This process's environment without S3 settings: the soak sets its own (its proxy, its retries)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
