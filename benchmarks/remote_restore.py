"""Restores straight from object storage (issue 38): a store whose checkpoint is on the loopback S3 server,
restored in a fresh JVM (an executor that holds none of its files), with range reads (the row image's index
and the blocks a lookup needs, the rest filled into the local cache in the background) against
``rowImages.rangeReads=false`` (today's download-then-open), at injected per-request latencies.

    nice -n 19 flock /work/spark.lock .venv/bin/python -m benchmarks.remote_restore \
        [--keys 1000000] [--latencies 0,10,50] [--heap 1g] [--server ranged|moto] [--jvm-flag -D...]
        [--out benchmarks/results/remote-restore]

Set-up: a moto server in its own process (``--server ranged``, the default: its ranged GETs read only their
range, as S3's do, ``tests/support/moto_ranges.py``; moto's own read the whole object for each, 72 ms for
64 KiB of a 106 MiB object), and the soak's fault proxy (``benchmarks/soak/proxy.py``) in front
of it with ``latency_s`` (every request waits that long before it is forwarded: an object store's first-byte
latency). One store (long key, long value) of ``--keys`` keys is written through a provider of
``tests/jvm/RemoteImageProbe.java`` straight to moto, compacted with its row image (version 1), and a few keys
are removed after it (version 2: a restore reads the image plus changes). Then, for each latency and mode, a
new probe JVM (and its new worker) reaches S3 only through the proxy and measures, with wall clocks around
each command:

* ``open``: ``getReadStore(2)`` on a new provider, then ``first get``: one key's lookup;
* ``batch``: lookups of 1% of the keys (a contiguous range of keys: their hashes spread over every block),
  right after the open; ``open + batch`` is what a task moving to a fresh executor pays before its puts;
* ``warm``: the same open, first get and batch in a JVM (and worker) that restored and read another store of
  the checkpoint first (partition 1, 1,000 keys, its image and changes after it): an executor that was
  running when the task moved to it;
* ``started``: the same in a fresh JVM that first ran what the executor plugin (``spark.plugins``, on by default
  through ``spark_state.configure``) runs when an executor starts: the Arrow conversion's and the restore path's
  warm-ups. A fresh executor started for the task that moves to it;
* ``scan``: in another fresh JVM, ``getReadStore(2)`` then a full scan of the store;
* bytes and requests the proxy forwarded for the restore (open + first get: with range reads, the
  background fill's first requests are under way by then and counted), for open + batch, and until the
  local copy is complete (the fill goes on after the batch), beside the image's size.

Every probe JVM has the heap of ``--heap`` (1 GiB: what users give an executor of two cores; the build runs in
4 GiB). Writes ``results.md`` and ``results.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.support import s3_server
from tests.support.jvm_probes import ProbeProcess, probe_command
from tests.support.s3_proxy import S3Proxy

ROOT = Path(__file__).resolve().parent.parent


class Probe(ProbeProcess):
    def ok(self, line: str) -> list[str]:
        reply = self.answer(line)
        if not reply.startswith("OK"):
            raise RuntimeError(f"{line}: {reply}")
        return reply.split()[1:]

    def timed(self, line: str) -> tuple[float, list[str]]:
        t0 = time.perf_counter()
        out = self.ok(line)
        return (time.perf_counter() - t0) * 1000, out


def restore_and_batch(p: Probe, proxy: S3Proxy, first: int, batch: int):
    """Times the open of store a's version 2, its first get (key ``first``) and the batch of ``batch`` keys
    after it; answers those times (ms) and the proxy's counts before the open, after the get, after the batch."""
    before = counts(proxy)
    t_open, _ = p.timed("open a 2")
    t_get, got = p.timed(f"get a {first}")
    assert got == [str(first)], got
    restored = counts(proxy)
    t_batch, n = p.timed(f"check a {first + 1} {first + 1 + batch} 1")
    assert n == [str(batch)], n
    return (t_open, t_get, t_batch), (before, restored, counts(proxy))


def cpu_seconds(*pids: int) -> float:
    """CPU time (user + system) these processes have used so far. The loopback S3 server and the proxy run on
    the same two cores as the worker and the JVM; what they use during a batch is the rig's share, which an
    object store does not take from the executor."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])   # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def counts(proxy: S3Proxy) -> tuple[int, int]:
    """(requests, bytes) the proxy forwarded so far."""
    s = proxy.stats()
    return s["requests"], s["bytes"]


def range_cost(fs, large: str, small: str) -> dict:
    """What one ranged GET costs the loopback server (no proxy), by the size of the object it reads from: moto
    reads and copies the whole object for every ranged GET, so its cost grows with the object; S3's does not.
    The figures say how much of a range-read restore's time is the test server's."""
    out = {}
    for name, path in (("large", large), ("small", small)):
        n = min(64 << 10, fs.size(path))
        t0 = time.perf_counter()
        for _ in range(5):
            fs.cat_file(path, start=0, end=n)
        out[f"range_get_ms_{name}"] = (time.perf_counter() - t0) / 5 * 1000
        out[f"object_bytes_{name}"] = fs.size(path)
    return out


def options(root: str, ranges: bool) -> list[str]:
    return [f"checkpointRoot={root}", "rowImages.minRows=0", "snapshotInterval=100",
            f"rowImages.rangeReads={'true' if ranges else 'false'}"]


class Rig:
    """The loopback S3 server with a bucket for one checkpoint, the latency proxy before it once
    ``behind_proxy`` ran, and the probe JVMs that read it: what this benchmark and the experiments beside its
    results (benchmarks/results/remote-restore/) start from. ``ranged``: the server's ranged GETs read only
    their range, as S3's do (tests/support/moto_ranges.py). It sets this process's AWS variables while it runs;
    ``close`` stops the server and the proxy and puts the environment back."""

    def __init__(self, jvm_flags: tuple[str, ...] = (), ranged: bool = True, heap: str = "1g",
                 prefix: str = "remote-restore-"):
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        self.jvm_flags = tuple(jvm_flags)
        self.heap = heap
        self.proxy: S3Proxy | None = None
        self._env = dict(os.environ)
        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1"})
        try:
            self.endpoint, self.server = s3_server.start_process(ranged=ranged)
        except BaseException:
            os.environ.clear()
            os.environ.update(self._env)
            raise
        os.environ["AWS_ENDPOINT_URL"] = self.endpoint
        try:
            import boto3

            self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=self.bucket)
        except BaseException:
            self.close()
            raise
        self.root = f"s3://{self.bucket}/state"
        self.classes = self.work / "classes"
        self.classes.mkdir()
        self.ckpt = self.work / "ckpt"

    def probe(self, heap: str | None = None, *jvm: str) -> Probe:
        """A new probe JVM (an executor) with the rig's JVM flags and its temporary files under the rig's."""
        cmd = probe_command("RemoteImageProbe.java", "io.sparkstate.shim.engine.RemoteImageProbe", self.classes,
                            f"-Djava.io.tmpdir={self.work}", *self.jvm_flags, *jvm, heap=heap or self.heap)
        return Probe(cmd)

    def provider(self, name: str, partition: int, ranges: bool) -> str:
        """The probe command making store ``name``'s provider for ``partition`` of the checkpoint."""
        return f"provider {name} {self.ckpt} {sys.executable} {partition} {' '.join(options(self.root, ranges))}"

    def build(self, keys: int, warm_store: bool = True) -> None:
        """Store a (partition 0): version 1 holds keys 0..keys-1, each its own value, version 2 deletes keys 0-2,
        so a restore of version 2 reads a row image and the changes after it. ``warm_store``: store w
        (partition 1) the same with 1,000 keys, what a warm executor served before the move. Background work
        drained: the row images are written."""
        p = self.probe("4g")
        try:
            for name, partition, n in (("a", 0, keys), ("w", 1, 1000))[:2 if warm_store else 1]:
                p.ok(self.provider(name, partition, True))
                assert p.ok(f"write {name} 0 0 {n} 1") == ["1"]
                p.ok("drain")
                assert p.ok(f"remove {name} 1 0 1 2") == ["2"]
        finally:
            p.close(120)

    def behind_proxy(self, latency_ms: float = 0) -> S3Proxy:
        """Puts the latency proxy before the server (for probes started from now on) and answers it."""
        self.proxy = S3Proxy(int(self.endpoint.rsplit(":", 1)[1]), self.work)
        os.environ["AWS_ENDPOINT_URL"] = self.proxy.url
        self.proxy.set_latency(latency_ms)
        return self.proxy

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.server.terminate()
        self.server.wait(10)
        os.environ.clear()
        os.environ.update(self._env)


def run(keys: int, latencies: list[int], out: Path, jvm_flags: tuple[str, ...] = (), server: str = "ranged",
        heap: str = "1g", repeat: int = 1) -> dict:
    rig = Rig(jvm_flags, ranged=server == "ranged", heap=heap)
    try:
        import fsspec

        @contextlib.contextmanager
        def fresh(spec: str):
            """A fresh executor: a new probe JVM with the provider of ``spec``, its worker up before the clock
            starts."""
            p = rig.probe()
            try:
                p.ok(spec)
                p.ok("fetched")
                yield p
            finally:
                p.close(60)

        t0 = time.perf_counter()
        rig.build(keys)
        fs = fsspec.filesystem("s3", client_kwargs={"endpoint_url": rig.endpoint})
        images = [f for f in fs.find(f"{rig.bucket}/state") if f.endswith(".img")]
        assert len(images) == 2, images
        image_bytes = max(fs.size(f) for f in images)
        print(f"built {keys:,} keys in {time.perf_counter() - t0:.0f} s; row image {image_bytes / 2**20:.1f} MiB",
              flush=True)
        server_cost = range_cost(fs, max(images, key=fs.size), min(images, key=fs.size))
        print(f"the server: {server_cost}", flush=True)

        proxy = rig.behind_proxy()
        moto = rig.server
        batch = max(1, keys // 100)
        first = keys // 2
        rows = []
        all_runs = []
        for latency in latencies:
            proxy.set_latency(latency)
            runs = []
            for rep in range(repeat):
                for mode in ("range", "download"):
                    ranges = mode == "range"
                    spec = rig.provider("a", 0, ranges)
                    # a fresh executor: open, first get, 1% of the keys
                    with fresh(spec) as p:
                        cpu0 = cpu_seconds(moto.pid, proxy.proc.pid)
                        (t_open, t_get, t_batch), (r0, r1, r2) = restore_and_batch(p, proxy, first, batch)
                        rig_cpu = cpu_seconds(moto.pid, proxy.proc.pid) - cpu0
                        fetched = [int(x) for x in p.ok("fetched")]
                        filled = None
                        if ranges:
                            t = time.perf_counter()
                            p.ok("filled a 600000")
                            filled = (time.perf_counter() - t) * 1000 + t_open + t_get + t_batch
                        r3 = counts(proxy)
                    # a fresh executor that ran the executor plugin's warm-ups when it started, before the task moved
                    with fresh(spec) as p:
                        p.ok("warmup")
                        time.sleep(0.5)
                        (s_open, s_get, s_batch), _ = restore_and_batch(p, proxy, first, batch)
                    # a warm executor (its JVM and worker served store w of the same checkpoint): open, first get,
                    # 1% of the keys of a store it holds no file of
                    p = rig.probe()
                    try:
                        p.ok(rig.provider("w", 1, ranges))
                        p.ok(spec)
                        p.ok("open w 2")
                        assert p.ok("get w 5") == ["5"]
                        (w_open, w_get, w_batch), (w0, w1, _) = restore_and_batch(p, proxy, first, batch)
                    finally:
                        p.close(60)
                    # another fresh executor: open, full scan
                    with fresh(spec) as p:
                        t_open2, _ = p.timed("open a 2")
                        t_scan, scanned = p.timed("scan a")
                        assert scanned[0] == str(keys - 3), scanned
                    row = dict(latency_ms=latency, mode=mode, rep=rep, open_ms=t_open, first_get_ms=t_get,
                               open_first_get_ms=t_open + t_get, batch_ms=t_batch,
                               open_batch_ms=t_open + t_get + t_batch, scan_open_ms=t_open2, scan_ms=t_scan,
                               open_scan_ms=t_open2 + t_scan,
                               restore_requests=r1[0] - r0[0], restore_bytes=r1[1] - r0[1],
                               batch_requests=r2[0] - r0[0], batch_bytes=r2[1] - r0[1],
                               total_requests=r3[0] - r0[0], total_bytes=r3[1] - r0[1],
                               shim_fetched_bytes=fetched[0], shim_fetch_requests=fetched[1],
                               filled_ms=filled, rig_cpu_s=rig_cpu, warm_open_ms=w_open, warm_first_get_ms=w_get,
                               started_open_ms=s_open, started_first_get_ms=s_get,
                               started_open_first_get_ms=s_open + s_get, started_open_batch_ms=s_open + s_get + s_batch,
                               warm_open_first_get_ms=w_open + w_get, warm_open_batch_ms=w_open + w_get + w_batch,
                               warm_restore_requests=w1[0] - w0[0], warm_restore_bytes=w1[1] - w0[1])
                    runs.append(row)
                    all_runs.append(row)
                    print(json.dumps(row), flush=True)
            rows += [_median([r for r in runs if r["mode"] == mode]) for mode in ("range", "download")]
        result = dict(keys=keys, image_bytes=image_bytes, batch_keys=batch, latencies=latencies, rows=rows,
                      rig=server_cost,
                      heap=heap, repeat=repeat, runs=all_runs,
                      command=" ".join(["python -m benchmarks.remote_restore", "--keys", str(keys), "--latencies",
                                        ",".join(map(str, latencies)), "--heap", heap, "--repeat", str(repeat),
                                        "--server", server,
                                        *(f"--jvm-flag={f}" for f in jvm_flags)]))
        write(result, out)
        return result
    finally:
        rig.close()


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    mib = result["image_bytes"] / 2**20
    lines = [
        "# Restores from object storage (issue 38)",
        "",
        f"`{result['command']}` (under `flock /work/spark.lock`): {result['keys']:,} keys "
        f"(long → long), row image {mib:.1f} MiB on the loopback S3 server (moto) behind the soak's proxy "
        f"with the given latency per request, every probe JVM with a {result.get('heap', '2g')} heap. "
        f"`cold`: a fresh JVM and worker (an executor just started); "
        f"`started`: a fresh JVM and worker that ran the executor plugin's warm-ups first (an executor started "
        f"for the task, with `spark.plugins` as `spark_state.configure` sets it); "
        f"`warm`: an executor whose JVM and worker served another store of the checkpoint before (a task "
        f"moving to an executor that was running). `range`: "
        f"rowImages.rangeReads=true, `download`: false (the whole image downloaded before the first get; "
        f"the default, auto, reads images of 64 MiB or more by range). Batch: gets of {result['batch_keys']:,} keys (1%) after the open; no puts, no commit. "
        f"{_runs_note(result.get('repeat', 1))}",
        "",
        "| latency | mode | getStore + first get (cold) | (started) | (warm) | open + 1% gets (cold) | (started) "
        "| (warm) | open + full scan (cold) | requests / MiB (restore) "
        "| requests / MiB (open + 1% gets) | requests / MiB (until the copy is complete) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["latency_ms"], r["mode"]): r for r in result["rows"]}
    for r in result["rows"]:
        lines.append(
            f"| {r['latency_ms']} ms | {r['mode']} | {r['open_first_get_ms']:,.0f} ms "
            f"| {_ms(r, 'started_open_first_get_ms')} | {r['warm_open_first_get_ms']:,.0f} ms "
            f"| {r['open_batch_ms']:,.0f} ms | {_ms(r, 'started_open_batch_ms')} | {r['warm_open_batch_ms']:,.0f} ms "
            f"| {r['open_scan_ms']:,.0f} ms | {r['restore_requests']} / {r['restore_bytes'] / 2**20:.2f} "
            f"| {r['batch_requests']} / {r['batch_bytes'] / 2**20:.2f} | {r['total_requests']} / "
            f"{r['total_bytes'] / 2**20:.2f} |")
    rig = result.get("rig")
    if rig:
        lines += ["", f"The test server's share: one ranged GET of 64 KiB costs the server "
                      f"{rig['range_get_ms_large']:.1f} ms from the {rig['object_bytes_large'] / 2**20:.1f} MiB image "
                      f"and {rig['range_get_ms_small']:.1f} ms from a {rig['object_bytes_small'] / 2**10:.0f} KiB one "
                      f"with no latency injected (`--server moto`: moto reads and copies the whole object for every "
                      f"ranged GET, which S3 does not; `--server ranged`, the default, reads only the range)."]
    lines += ["", "CPU the loopback S3 server and the proxy used during the cold open + 1% gets (of the two cores "
                  "the worker and the JVM also run on; an object store takes none of the executor's):", "",
              "| latency | mode | open + 1% gets | server and proxy CPU |", "|---|---|---|---|"]
    for r in result["rows"]:
        if r.get("rig_cpu_s") is not None:
            lines.append(f"| {r['latency_ms']} ms | {r['mode']} | {r['open_batch_ms']:,.0f} ms "
                         f"| {r['rig_cpu_s'] * 1000:,.0f} ms |")
    lines += ["", "Ratios, range ÷ download:", "",
              "| latency | getStore + first get (cold) | (started) | (warm) | open + 1% gets (cold) | (started) | (warm) "
              "| open + full scan |",
              "|---|---|---|---|---|---|---|---|"]
    for latency in result["latencies"]:
        a, b = by.get((latency, "range")), by.get((latency, "download"))
        if a and b:
            lines.append(f"| {latency} ms | {a['open_first_get_ms'] / b['open_first_get_ms']:.2f}× "
                         f"| {_ratio(a, b, 'started_open_first_get_ms')} "
                         f"| {a['warm_open_first_get_ms'] / b['warm_open_first_get_ms']:.2f}× "
                         f"| {a['open_batch_ms'] / b['open_batch_ms']:.2f}× "
                         f"| {_ratio(a, b, 'started_open_batch_ms')} "
                         f"| {a['warm_open_batch_ms'] / b['warm_open_batch_ms']:.2f}× "
                         f"| {a['open_scan_ms'] / b['open_scan_ms']:.2f}× |")
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _median(runs: list[dict]) -> dict:
    """One row of the runs of a latency and mode: the median of every figure (its runs stay in ``runs``)."""
    row = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("latency_ms", "rep"):
            values = [r[key] for r in runs if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
    row.pop("rep", None)
    row["runs"] = len(runs)
    return row


def _runs_note(repeat: int) -> str:
    if repeat <= 1:
        return "One run per figure."
    return (f"Every figure is the median of {repeat} runs, the modes alternating (each run is in results.json, "
            f"`runs`).")


def _ms(row: dict, key: str) -> str:
    """A time of the row, or - (results of a release that did not measure it)."""
    return f"{row[key]:,.0f} ms" if row.get(key) is not None else "-"


def _ratio(a: dict, b: dict, key: str) -> str:
    return f"{a[key] / b[key]:.2f}×" if a.get(key) and b.get(key) else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--latencies", default="0,10,50")
    ap.add_argument("--heap", default="1g", help="every restore probe's heap (the build's is 4g)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of every latency and mode, alternating; the tables give medians, results.json each run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "remote-restore")
    ap.add_argument("--jvm-flag", action="append", default=[],
                    help="a JVM option for every probe, e.g. -Dspark_state.imageFillBytes=1048576 (A/B of a knob)")
    ap.add_argument("--server", choices=("ranged", "moto"), default="ranged",
                    help="ranged: moto whose ranged GETs read only their range, as S3's do (tests/support/moto_ranges.py); "
                         "moto: moto as it is (every ranged GET reads the whole object)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 or more runs")
    run(args.keys, [int(x) for x in args.latencies.split(",")], args.out, tuple(args.jvm_flag), args.server, args.heap,
        args.repeat)


if __name__ == "__main__":
    main()
