"""Where a getStore + first get spends its time, request by request (issue 38, stop 46; started, session 10).

Run from the repository root: ``python benchmarks/results/remote-restore/trace/trace.py KEYS LATENCY_MS
[JVM flags]`` (under ``flock /work/spark.lock``). Builds KEYS keys on the loopback S3 server (as
benchmarks/remote_restore.py does), then RUNS times (default 3): a JVM serves store w (a warm executor) or,
with ``TRACE_MODE=started``, runs what the executor plugin runs at an executor's start; then it opens store a
and gets one key, and prints each request the proxy forwarded meanwhile (SPARK_STATE_PROXY_TRACE) with its
start and end in ms from the open, and the open's start as a Unix time (``abs t0``) to line up other clocks
with (``trace-points.patch`` beside this script)."""
import json, os, sys, tempfile, time, uuid
from pathlib import Path
sys.path.insert(0, os.getcwd())
from tests.support import s3_server
from tests.support.s3_proxy import S3Proxy
from tests.support.jvm_probes import probe_command
from benchmarks.remote_restore import Probe, options

keys = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
lat = int(sys.argv[2]) if len(sys.argv) > 2 else 10
extra = sys.argv[3:]
work = Path(tempfile.mkdtemp(prefix="trace-"))
os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
endpoint, moto = s3_server.start_process(ranged=True)
os.environ["AWS_ENDPOINT_URL"] = endpoint
import boto3
bucket = f"bench-{uuid.uuid4().hex[:8]}"
boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
root = f"s3://{bucket}/state"
classes = work / "classes"; classes.mkdir(); ckpt = work / "ckpt"
def probe(heap="2g"):
    return Probe(probe_command("RemoteImageProbe.java", "io.sparkstate.shim.engine.RemoteImageProbe", classes,
                               f"-Djava.io.tmpdir={work}", *extra, heap=heap))
p = probe("4g")
p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}")
p.ok(f"write a 0 0 {keys} 1"); p.ok("drain"); p.ok("remove a 1 0 1 2")
p.ok(f"provider w {ckpt} {sys.executable} 1 {' '.join(options(root, True))}")
p.ok("write w 0 0 1000 1"); p.ok("drain"); p.ok("remove w 1 0 1 2")
p.close(120)
trace = work / "trace.jsonl"
os.environ["SPARK_STATE_PROXY_TRACE"] = str(trace)
proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), work)
os.environ["AWS_ENDPOINT_URL"] = proxy.url
proxy.set_latency(lat)
started = os.environ.get("TRACE_MODE", "warm") == "started"
for run in range(int(os.environ.get("RUNS", "3"))):
    p = probe()
    p.ok(f"provider w {ckpt} {sys.executable} 1 {' '.join(options(root, True))}")
    p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}")
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
proxy.stop(); moto.terminate()
