"""Interleaved A/B in one tree: A = deferChanges off, B = on (session 8). usage: exp13.py KEYS LATENCY REPS TREE [KIND,...]"""
import os, sys, time, uuid, tempfile, json, subprocess
from pathlib import Path
keys = int(sys.argv[1]); latency = int(sys.argv[2]); reps = int(sys.argv[3]); trees = {"A": sys.argv[4], "B": sys.argv[4]}
kinds = (sys.argv[5] if len(sys.argv) > 5 else "started").split(",")
flags = {"A": ["-Dspark_state.deferChanges=false"], "B": []}
sys.path.insert(0, trees["B"])
from benchmarks.remote_restore import Probe, options, cpu_seconds
from tests.support import s3_server
from tests.support.jvm_probes import OPENS
from tests.support.s3_proxy import S3Proxy
from spark_state.spark import shim
work = Path(tempfile.mkdtemp(prefix="exp12-"))
os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
endpoint, moto = s3_server.start_process(ranged=True)
os.environ["AWS_ENDPOINT_URL"] = endpoint
import boto3
bucket = f"bench-{uuid.uuid4().hex[:8]}"
boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
root = f"s3://{bucket}/state"
ckpt = work / "ckpt"
spark = shim.spark_jars_dir()
cmds = {}
for name, tree in trees.items():
    classes = work / f"classes-{name}"; classes.mkdir()
    cp = f"{tree}/jvm-shim/build/spark-state-shim-spark4.3.0.jar:{spark}/*"
    subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", cp, f"{tree}/tests/jvm/RemoteImageProbe.java",
                    f"{tree}/tests/jvm/Probes.java"], check=True)
    cmds[name] = lambda heap, classes=classes, cp=cp, name=name: ["java", f"-Xmx{heap}", *OPENS, *flags[name], f"-Djava.io.tmpdir={work}", "-cp",
                                                        f"{classes}:{cp}", "io.sparkstate.shim.engine.RemoteImageProbe"]
def probe(name, heap="1g"):
    os.environ["PYTHONPATH"] = trees[name]
    return Probe(cmds[name](heap))
p = probe("B", "4g")
p.ok(f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, True))}")
p.ok(f"write a 0 0 {keys} 1"); p.ok("drain"); p.ok("remove a 1 0 1 2")
p.ok(f"provider w {ckpt} {sys.executable} 1 {' '.join(options(root, True))}")
p.ok("write w 0 0 1000 1"); p.ok("drain"); p.ok("remove w 1 0 1 2"); p.close(120)
proxy = S3Proxy(int(endpoint.rsplit(":", 1)[1]), work)
os.environ["AWS_ENDPOINT_URL"] = proxy.url
proxy.set_latency(latency)
first = keys // 2; batch = keys // 100
try:
    for rep in range(reps):
        order = ["A", "B"] if rep % 2 == 0 else ["B", "A"]
        for kind in kinds:
            mode = "range"
            for name in order:
                spec = f"provider a {ckpt} {sys.executable} 0 {' '.join(options(root, mode == 'range'))}"
                p = probe(name); p.ok(spec); p.ok("fetched")
                if kind == "started":
                    p.ok("warmup")
                elif kind == "warm":
                    p.ok(f"provider w {ckpt} {sys.executable} 1 {' '.join(options(root, True))}")
                    p.ok("open w 2"); p.ok("get w 5")
                time.sleep(0.5)
                t0 = time.perf_counter()
                p.ok("open a 2"); p.ok(f"get a {first}")
                t1 = time.perf_counter()
                p.ok(f"check a {first + 1} {first + 1 + batch} 1")
                t2 = time.perf_counter()
                p.close(60)
                print(json.dumps(dict(tree=name, kind=kind, rep=rep, first=round((t1 - t0) * 1000), batch=round((t2 - t0) * 1000))), flush=True)
finally:
    proxy.stop(); moto.terminate(); moto.wait(10)
