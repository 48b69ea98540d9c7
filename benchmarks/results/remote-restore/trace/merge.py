"""Merges SS_TRACE lines and the proxy trace per run: merge.py TRACEFILE TRACE2_OUTPUT"""
import sys, re
lines = [l.split(None, 3) for l in open(sys.argv[1]) if l.strip()]
out = open(sys.argv[2]).read()
t0s = [float(x) for x in re.findall(r"abs t0 ([0-9.]+)", out)]
reqs = re.findall(r"^\s+([0-9.]+) \.\.\s+([0-9.]+)\s+GET \S+/([^/ ]+) (\S+)", out, re.M)
for i, t0 in enumerate(t0s):
    t1 = t0s[i+1] if i + 1 < len(t0s) else 1e18
    ev = [(int(l[1])/1e6 - t0)*1000 for l in lines]
    print(f"--- run {i}")
    for l, t in zip(lines, ev):
        if -5 < t < (t1 - t0)*1000 and t < 400:
            print(f"  {t:7.1f}  {l[0]} {l[2][:28]:28s} {l[3].strip()}")
