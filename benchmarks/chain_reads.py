"""Loads of a long chain from an S3 server on loopback: the chain's files one after another, or up to
``spark_state.chain.reader.READ_AHEAD`` at once (what remote storage does since the chaos soak found a rescaled
store's chain of 80 files loading in 88 s under S3 faults).

    python -m benchmarks.chain_reads [--rows 100000] [--deltas 30] [--rounds 5] [--fault-rate 0.0]

A store on ``s3://`` (moto's server in its own process, optionally behind the soak's fault-injecting proxy
with ``--fault-rate``): version 1 a snapshot of ``--rows`` rows, then ``--deltas`` deltas of 1% of the keys
each, no compaction. Each round loads the last version (snapshot + every delta merged) both ways, the order
alternating, and the report gives the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _store(endpoint: str, rows: int, deltas: int):
    from benchmarks.bench_storage import make_rows
    from spark_state.chain import open_store
    from spark_state.options import Settings
    from spark_state.storage.layout import StoreRef

    base, keys, hashes = make_rows(rows)
    ref = StoreRef("s3://bench/ckpt/state", "s3://bench/ckpt/state/0/0", 0, 0)
    store = open_store(ref, Settings(storage="filesystem", snapshot_interval=1_000_000))
    store.commit(1, base)
    rng = np.random.default_rng(1)
    for v in range(2, deltas + 2):
        idx = rng.choice(rows, max(1, rows // 100), replace=False)
        update, _, _ = make_rows(len(idx), seed=v, keys=keys[idx], hashes=hashes[idx])
        store.commit(v, update)
    return store, deltas + 1


def run(rows: int, deltas: int, rounds: int, fault_rate: float) -> dict:
    import boto3

    from tests.support.s3_server import start_process

    endpoint, moto = start_process()
    proxy = None
    try:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        url = endpoint
        if fault_rate > 0:
            url, proxy = _proxy(endpoint, fault_rate)
        os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                          AWS_DEFAULT_REGION="us-east-1")
        store, last = _store(url, rows, deltas)
        storage = store.storage
        times: dict[bool, list[float]] = {False: [], True: []}
        expected = None
        for r in range(rounds):
            for concurrent in ((False, True) if r % 2 == 0 else (True, False)):
                storage.remote = concurrent
                t = time.perf_counter()
                n = store.load(last).num_rows
                times[concurrent].append(time.perf_counter() - t)
                assert expected in (None, n), (expected, n)
                expected = n
        one, many = statistics.median(times[False]), statistics.median(times[True])
        return {"rows": expected, "files": last, "rounds": rounds, "fault_rate": fault_rate,
                "one_at_a_time_s": round(one, 3), "read_ahead_s": round(many, 3), "ratio": round(many / one, 3),
                "each_s": {"one_at_a_time": [round(t, 2) for t in times[False]],
                           "read_ahead": [round(t, 2) for t in times[True]]}}
    finally:
        if proxy is not None:
            proxy.kill()
        moto.kill()


def _proxy(endpoint: str, rate: float):
    """The soak's fault-injecting proxy in front of moto (benchmarks/soak/proxy.py)."""
    import json

    from benchmarks.soak.cluster import READ_TIMEOUT_S
    from tests.support.ports import free_port, wait_listening

    work = Path(tempfile.mkdtemp(prefix="chain-reads-"))
    control = work / "control.json"
    control.write_text(json.dumps({"rate": rate, "stall_s": READ_TIMEOUT_S + 3}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.soak.proxy", "--port", str(port), "--upstream-port",
                             endpoint.rsplit(":", 1)[1], "--control", str(control), "--log", str(work / "faults.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_listening(port, proc, 30):
        proc.kill()
        raise RuntimeError(f"the fault-injecting proxy did not start on port {port}; its log is {work}")
    return f"http://127.0.0.1:{port}", proc


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chain_reads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--deltas", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fault-rate", type=float, default=0.0,
                    help="fraction of S3 requests the soak's proxy fails, stalls, slows or drops (default 0)")
    args = ap.parse_args(argv)
    import json

    print(json.dumps(run(args.rows, args.deltas, args.rounds, args.fault_rate)))


if __name__ == "__main__":
    main()
