"""Gets on a complete local copy (range reads, after the fill) against gets on a downloaded image (issue 38,
session 10). From the repository root: ``python benchmarks/results/remote-restore/s10-head/gets.py KEYS LATENCY_MS
[JVM flags]`` under ``flock /work/spark.lock``; prints per fresh JVM the open, first get, the wait for the fill
and three batches of 1% of the keys."""
import os, sys
sys.path.insert(0, os.getcwd())
from benchmarks.remote_restore import Rig

keys = int(sys.argv[1]); lat = int(sys.argv[2])
rig = Rig(tuple(sys.argv[3:]), prefix="gets-")
rig.build(keys, warm_store=False)
rig.behind_proxy(lat)
first = keys // 2; batch = keys // 100
for rep in range(3):
    for mode in ("range", "download"):
        p = rig.probe()
        p.ok(rig.provider("a", 0, mode == "range"))
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
rig.close()
