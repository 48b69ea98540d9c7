"""Gets on a complete local copy (range reads, after the fill) against gets on a downloaded image (issue 38,
session 10). From the repository root: ``python benchmarks/results/remote-restore/s10-head/gets.py KEYS LATENCY_MS
[JVM flags]`` under ``flock /work/spark.lock``; prints per fresh JVM the open, first get, the wait for the fill
and three batches of 1% of the keys."""
import os, sys, tempfile, time, uuid
from pathlib import Path
sys.path.insert(0, os.getcwd())
from tests.support import s3_server
from tests.support.s3_proxy import S3Proxy
from tests.support.jvm_probes import probe_command
from benchmarks.remote_restore import Probe, options
keys = int(sys.argv[1]); lat = int(sys.argv[2]); extra = sys.argv[3:]
work = Path(tempfile.mkdtemp(prefix="gets-"))
os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
endpoint, moto = s3_server.start_process(ranged=True)
os.environ["AWS_ENDPOINT_URL"] = endpoint
import boto3
bucket = f"bench-{uuid.uuid4().hex[:8]}"
boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
root = f"s3://{bucket}/state"
classes = work / "classes"; classes.mkdir(); ckpt = work / "ckpt"
def probe(heap="1g"):
    return Probe(probe_command("RemoteImageProbe.java", "io.sparkstate.shim.engine.RemoteImageProbe", classes,
                               f"-Djava.io.tmpdir={work}", *extra, heap=heap))
p = probe("4g")
p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}")
p.ok(f"write a 0 0 {keys} 1"); p.ok("drain"); p.ok("remove a 1 0 1 2")
p.close(120)
proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), work)
os.environ["AWS_ENDPOINT_URL"] = proxy.url
proxy.set_latency(lat)
first = keys // 2; batch = keys // 100
for rep in range(3):
    for mode in ("range", "download"):
        p = probe()
        p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, mode == 'range'))}")
        p.ok("fetched")
        t_open, _ = p.timed("open a 2"); t_get, _ = p.timed(f"get a {first}")
        t_fill = 0
        if mode == "range":
            t_fill, _ = p.timed("filled a 600000")
        b1, _ = p.timed(f"check a {first+1} {first+1+batch} 1")
        b2, _ = p.timed(f"check a {first+1} {first+1+batch} 1")
        b3, _ = p.timed(f"check a 10 {batch+10} 1")
        p.close(60)
        print(f"{mode:8s} open {t_open:7.1f} get {t_get:6.1f} fill-wait {t_fill:7.1f} batch1 {b1:7.1f} batch2 {b2:7.1f} other {b3:7.1f}", flush=True)
proxy.stop(); moto.terminate()
