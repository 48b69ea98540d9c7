# A/B of the executor plugin's warm-ups while they were built (see README.md: the SS_EXP_WARM_REQUEST switch is gone).
"""Cold open + first get with and without the plugin's JVM warm-up first (session 6)."""
import os, sys, time, uuid, tempfile
from pathlib import Path
sys.path.insert(0, os.getcwd())
from benchmarks.remote_restore import Probe, options
from tests.support import s3_server
from tests.support.jvm_probes import probe_command
from tests.support.s3_proxy import S3Proxy
keys = int(sys.argv[1]); latency = int(sys.argv[2]); reps = int(sys.argv[3]); heap = sys.argv[4]
work = Path(tempfile.mkdtemp(prefix="exp8-"))
os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
endpoint, moto = s3_server.start_process(ranged=True)
os.environ["AWS_ENDPOINT_URL"] = endpoint
import boto3
bucket = f"bench-{uuid.uuid4().hex[:8]}"
boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
root = f"s3://{bucket}/state"
classes = work / "classes"; classes.mkdir(); ckpt = work / "ckpt"
def probe(heap):
    return Probe(probe_command("RemoteImageProbe.java", "io.sparkstate.shim.engine.RemoteImageProbe", classes,
                               f"-Djava.io.tmpdir={work}", heap=heap))
p = probe("4g")
p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}")
p.ok(f"write a 0 0 {keys} 1"); p.ok("drain"); p.ok("remove a 1 0 1 2"); p.close(120)
proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), work)
os.environ["AWS_ENDPOINT_URL"] = proxy.url
proxy.set_latency(latency)
spec = f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}"
try:
    for rep in range(reps):
        for warm in (0, 1):
            os.environ["SS_EXP_WARM_REQUEST"] = str(warm)
            p = probe(heap); p.ok(spec); p.ok("fetched")
            w = p.ok("warmup")
            time.sleep(1)
            to, _ = p.timed("open a 2"); tg, _ = p.timed(f"get a {keys // 2}")
            p.close(60)
            print(f"request {warm} ({w[0]} ms): open {to:.0f} + get {tg:.0f} = {to + tg:.0f} ms", flush=True)
finally:
    proxy.stop(); moto.terminate(); moto.wait(10)
