"""``python -m benchmarks.soak --minutes N``: the chaos soak (benchmarks/soak/__init__.py says what it does)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.soak.report import write_report
from benchmarks.soak.run import Settings, cleanup, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    ap.add_argument("--minutes", type=float, default=60.0, help="soak time before the end checks (default 60)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/soak"), help="report and raw samples")
    ap.add_argument("--workdir", type=Path, help="input, checkpoints, logs (default: a new temporary directory)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-every", type=float, default=25.0, help="mean seconds between faults (default 25)")
    ap.add_argument("--tick", type=float, default=4.0, help="seconds between ticks of input (default 4)")
    ap.add_argument("--grace", type=float, default=30.0, help="fileGracePeriod in seconds (default 30)")
    ap.add_argument("--orphan-slack", type=float, default=30.0,
                    help="seconds past the grace period an unreferenced file may still live (default 30)")
    ap.add_argument("--orphan-patience", type=float, default=240.0,
                    help="seconds files still unreferenced at the second look are watched further (default 240)")
    ap.add_argument("--every-kind", action="store_true",
                    help="go on past --minutes until every kind of fault was performed at least once")
    ap.add_argument("--first", default="", help="comma-separated fault kinds the schedule starts with")
    ap.add_argument("--memory-limit", help="spark_state's memoryLimit, e.g. 256k: small enough that every store "
                                           "spills into sorted runs (default: spark_state's default)")
    ap.add_argument("--range-reads", action="store_true",
                    help="a row image beside every snapshot (rowImages.minRows=0), read by range on every restore "
                         "(rowImages.rangeReads=true): restores fetch blocks from S3 through the faults")
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from what --out recorded")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)
    if args.report_only:
        write_report(args.out)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-", dir=os.environ.get("TMPDIR")))
    cfg = Settings(minutes=args.minutes, out=args.out, workdir=workdir, seed=args.seed, mean_gap_s=args.fault_every, tick_s=args.tick,
                   grace_s=args.grace, orphan_slack_s=args.orphan_slack, orphan_patience_s=args.orphan_patience,
                   every_kind=args.every_kind, first_kinds=tuple(k for k in args.first.split(",") if k),
                   memory_limit=args.memory_limit, range_reads=args.range_reads)
    summary = run(cfg)
    write_report(args.out)
    print(f"report: {args.out / 'results.md'}; working directory {workdir}", file=sys.stderr)
    if summary.get("passed") and not args.keep and args.workdir is None:
        cleanup(workdir)
    return 0 if summary.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
