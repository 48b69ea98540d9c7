"""Where a getStore + first get spends its time, request by request (issue 38, stop 46; started, session 10).

Run from the repository root: ``python benchmarks/results/remote-restore/trace/trace.py KEYS LATENCY_MS
[JVM flags]`` (under ``flock /work/spark.lock``). Builds KEYS keys on the loopback S3 server (as
benchmarks/remote_restore.py does), then RUNS times (default 3): a JVM serves store w (a warm executor) or,
with ``TRACE_MODE=started``, runs what the executor plugin runs at an executor's start; then it opens store a
and gets one key, and prints each request the proxy forwarded meanwhile (SPARK_STATE_PROXY_TRACE) with its
start and end in ms from the open, and the open's start as a Unix time (``abs t0``) to line up other clocks
with (``trace-points.patch`` beside this script)."""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
from benchmarks.remote_restore import Rig

keys = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
lat = int(sys.argv[2]) if len(sys.argv) > 2 else 10
rig = Rig(tuple(sys.argv[3:]), heap="2g", prefix="trace-")
rig.build(keys)
trace = rig.work / "trace.jsonl"
os.environ["SPARK_STATE_PROXY_TRACE"] = str(trace)
rig.behind_proxy(lat)
started = os.environ.get("TRACE_MODE", "warm") == "started"
for run in range(int(os.environ.get("RUNS", "3"))):
    p = rig.probe()
    p.ok(rig.provider("w", 1, True))
    p.ok(rig.provider("a", 0, True))
    if started:
        p.ok("warmup")
    else:
        p.ok("open w 2"); assert p.ok("get w 5") == ["5"]
    time.sleep(0.5)
    trace.write_text("")
    t0 = time.time()
    o = p.ok("open a 2")
    t1 = time.time()
    g = p.ok(f"get a {keys//2}")
    t2 = time.time()
    time.sleep(0.3)
    p.close(60)
    print(f"abs t0 {t0:.4f}")
    print(f"run {run}: open {1000*(t1-t0):.1f} ms (jvm says {o}), first get {1000*(t2-t1):.1f} ms, total {1000*(t2-t0):.1f}")
    for line in trace.read_text().splitlines():
        r = json.loads(line)
        if r["t0"] > t2: continue
        print(f"   {1000*(r['t0']-t0):7.1f} .. {1000*(r['t1']-t0):7.1f}  {r['m']} {r['path'][:90]} {r['range']}")
rig.close()
