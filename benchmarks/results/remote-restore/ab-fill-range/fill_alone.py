"""Experiment: the background fill alone (no gets) vs the download at 10 ms: wall time and CPU per process."""
import os, sys, time, uuid, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))   # the repository
from benchmarks.remote_restore import Probe, options, cpu_seconds
from tests.support import s3_server
from tests.support.jvm_probes import probe_command
from tests.support.s3_proxy import S3Proxy

KEYS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
FLAGS = sys.argv[2:]

def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
                if int(st[1]) == pid:
                    out.append(int(p))
            except OSError:
                pass
    return out

work = Path(tempfile.mkdtemp(prefix="fillrate-"))
os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
endpoint, moto = s3_server.start_process(ranged=True)
os.environ["AWS_ENDPOINT_URL"] = endpoint
import boto3
bucket = f"bench-{uuid.uuid4().hex[:8]}"
boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
root = f"s3://{bucket}/state"
classes = work / "classes"; classes.mkdir(); ckpt = work / "ckpt"
def probe(heap="2g", extra=()):
    return Probe(probe_command("RemoteImageProbe.java", "io.sparkstate.shim.engine.RemoteImageProbe", classes,
                               f"-Djava.io.tmpdir={work}", *FLAGS, *extra, heap=heap))
p = probe("4g")
p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}")
p.ok(f"write a 0 0 {KEYS} 1"); p.ok("drain"); p.ok("remove a 1 0 1 2"); p.close(120)
proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), work)
os.environ["AWS_ENDPOINT_URL"] = proxy.url
proxy.set_latency(10)
try:
    for rep in range(int(os.environ.get("REPS", "2"))):
        for mode in os.environ.get("MODES", "range,download").split(","):
            spec = f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, mode == 'range'))}"
            p = probe(extra=tuple(os.environ.get("PROBE_FLAGS", "").split()))
            p.ok(spec); p.ok("fetched")
            jvm = p.proc.pid
            kids = [k for k in children(jvm)]
            c0 = {n: cpu_seconds(x) for n, x in (("rig", moto.pid), ("proxy", proxy.proc.pid), ("jvm", jvm))}
            c0["worker"] = cpu_seconds(*kids) if kids else 0
            t = time.perf_counter()
            t_open, _ = p.timed("open a 2")
            if mode == "range":
                p.ok("get a 5")
                p.ok("filled a 600000")
            wall = (time.perf_counter() - t) * 1000
            checks = []
            for k in range(int(os.environ.get("CHECKS", "3"))):
                t_check, n = p.timed(f"check a {KEYS // 2 + 1 + k * 100000} {KEYS // 2 + 1 + (k + 1) * 100000} 1")
                checks.append(round(t_check))
            print(mode, rep, "100K gets after the copy is complete/open (ms):", checks, flush=True)
            c1 = {n: cpu_seconds(x) for n, x in (("rig", moto.pid), ("proxy", proxy.proc.pid), ("jvm", jvm))}
            c1["worker"] = cpu_seconds(*kids) if kids else 0
            print(mode, rep, f"open {t_open:.0f} ms, until complete {wall:.0f} ms;",
                  "cpu s:", {k: round(c1[k] - c0[k], 2) for k in c0}, "worker pids", kids, flush=True)
            p.close(60)
finally:
    proxy.stop(); moto.terminate()
