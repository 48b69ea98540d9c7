"""The soak's report, from what the run recorded in ``out``: results.md (the table), results.json (every raw
sample) and soak.png (batch latency, memory and state files over time, faults marked)."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.soak.faults import KINDS


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass   # a line cut short by a dying run
    return out


def _progress_t(p: dict) -> float | None:
    try:
        return datetime.strptime(p["t"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def load(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    samples = _lines(out / "samples.jsonl")
    proxy = summary.get("proxy") or (samples[-1].get("proxy") if samples else None) or {}
    return {"summary": summary, "samples": samples, "progress": _lines(out / "progress.jsonl"),
            "faults": _lines(out / "faults.jsonl"), "recoveries": _lines(out / "recoveries.jsonl"),
            "notes": (out / "NOTES.md").read_text() if (out / "NOTES.md").exists() else "",
            "proxy": proxy, "proxy_faults": Counter(proxy.get("faults") or {})}


def write_report(out: Path) -> None:
    data = load(out)
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "results.md").write_text(markdown(data))
    plot(data, out / "soak.png")


def markdown(data: dict) -> str:
    s, samples, progress, faults = data["summary"], data["samples"], data["progress"], data["faults"]
    minutes = s.get("soak_s", (samples[-1]["elapsed_s"] if samples else 0)) / 60
    queries = s.get("queries", {})
    durations = [p["duration_ms"] for p in progress if p.get("duration_ms") is not None and p.get("rows")]
    done = Counter(f["kind"] for f in faults if f.get("ok"))
    skipped = Counter(f["kind"] for f in faults if not f.get("ok") and f["kind"] != "query-failed")
    recovered, idle = recoveries(faults, progress)
    problems = s.get("problems", {})
    lost = sum(len(v) for k, v in problems.items() if k.split(": ")[-1] in ("output", "state"))
    settings = s.get("settings", {})
    lines = [
        "# Chaos soak: two executors, state on S3 behind a fault-injecting proxy",
        "",
        f"`python -m benchmarks.soak --minutes {settings.get('minutes', '?')} --seed {settings.get('seed', '?')}"
        f"{' --memory-limit ' + settings['memory_limit'] if settings.get('memory_limit') else ''}"
        f"{' --range-reads' if settings.get('range_reads') else ''}` "
        f"(`make soak MINUTES={settings.get('minutes', '?')}"
        f"{' MEMORY_LIMIT=' + settings['memory_limit'] if settings.get('memory_limit') else ''}"
        f"{' RANGE_READS=1' if settings.get('range_reads') else ''}`) at git `{s.get('git', '?')}`, "
        f"{_when(s.get('started'))}, on the 2-core machine shared with other work (niceness {s.get('niceness', '?')}). "
        f"Result: **{'PASSED' if s.get('passed') else 'FAILED' if s else 'INCOMPLETE (no end checks recorded)'}**.",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| soak time (faults firing, input flowing) | {minutes:.1f} min |",
        f"| input ticks (one file per stream each) | {s.get('ticks', '?')} |",
        f"| input rows (events / orders / payments) | {' / '.join(str(v) for v in s.get('input_rows', {}).values())} |",
        f"| batches committed (agg / sessions / dedup / join) | "
        f"{' / '.join(str(queries.get(n, {}).get('batches', '?')) for n in ('agg', 'sessions', 'dedup', 'join'))} |",
        f"| rows emitted | {sum(q.get('rows_out', 0) for q in queries.values())} |",
        f"| memoryLimit | {settings.get('memory_limit') or 'default'} |",
        f"| row images read by range on every restore (rowImages.rangeReads=true, minRows=0) | "
        f"{'yes' if settings.get('range_reads') else 'no (the defaults)'} |",
        f"| spills into sorted runs (agg / sessions / dedup / join) | "
        f"{' / '.join(str(sum(p.get('spills', 0) for p in progress if p.get('query') == n)) for n in ('agg', 'sessions', 'dedup', 'join'))} |",
        f"| batch duration with input, median / p95 / max | {_pct(durations)} |",
        f"| faults injected | {sum(done.values())} |",
        f"| recoveries (every query committed a batch again after a fault), median / max time | "
        f"{len(recovered)}{f', {statistics.median(recovered):.0f} s / {max(recovered):.0f} s' if recovered else ''} |",
        f"| faults after which some query had no input left to run a batch on (nothing to judge recovery by) "
        f"| {idle} |",
        f"| queries failed and restarted from their checkpoint | {sum(1 for f in faults if f['kind'] == 'query-failed')} |",
        f"| task re-attempts (retries and speculative copies) | {len(s.get('task_reattempts', []))} |",
        f"| S3 requests through the proxy / failed, stalled, slowed or dropped | "
        f"{data['proxy'].get('requests', '?')} / {sum(data['proxy_faults'].values())} |",
        f"| retained versions loaded at the end | {sum(q.get('versions_loaded', 0) for q in queries.values())} |",
        f"| files checked by `spark-state validate` | {sum(q.get('validated_files') or 0 for q in queries.values())} |",
        f"| orphan files beyond the grace period | {sum(q.get('orphans', 0) for q in queries.values())} |",
        f"| **rows or state lost, doubled or wrong** | **{lost if s else '?'}** |",
        "",
        "## Faults",
        "",
        "| kind | injected | not performed (e.g. nothing to kill at that moment) |",
        "|---|---:|---:|",
        *[f"| {k} | {done.get(k, 0)} | {skipped.get(k, 0)} |" for k in KINDS],
        "",
        "Fault points fired in the state workers: " + ", ".join(
            f"{k} {v}" for k, v in s.get("fault_points_fired", {}).items()) + ".",
        "S3 faults by kind (proxy): " + ", ".join(f"{k} {v}" for k, v in sorted(data["proxy_faults"].items())) + ".",
        "",
        "## End checks",
        "",
    ]
    for name, q in queries.items():
        lines.append(f"- **{name}**: {q.get('batches')} batches on checkpoints {', '.join(q.get('checkpoints', []))}; "
                     f"output and state equal the model's: "
                     f"{'yes' if not problems.get(f'{name}: output') and not problems.get(f'{name}: state') else 'NO'}; "
                     f"{q.get('versions_loaded')} retained versions load; validate "
                     f"{'clean' if not problems.get(f'{name}: validate') else 'NOT clean'} "
                     f"({q.get('validated_files')} files); {q.get('orphans')} orphans"
                     + (f" ({q['deleted_late']} more file(s) deleted after the second look, within "
                        f"{q.get('watched_s')} s of the first)" if q.get("deleted_late") else "") + ".")
    mem = s.get("memory", {})
    if mem:
        lines += ["", "Memory (MiB): " + "; ".join(
            f"{k}: peak {v['peak_middle_third_mib']:.0f} in the middle third, {v['peak_last_third_mib']:.0f} in the last"
            for k, v in mem.items()) + "."]
    notes = data.get("notes")
    if notes:
        lines += ["", "## Notes on this run", "", notes.strip()]
    if problems:
        lines += ["", "## Problems", ""] + [f"- {k}: {p}" for k, v in problems.items() for p in v]
    lines += ["", "Raw samples: `results.json`; over time: `soak.png`.", ""]
    return "\n".join(lines)


def recoveries(faults: list[dict], progress: list[dict]) -> tuple[list[float], int]:
    """Seconds from each fault until every query committed a batch that started after the fault ended (from the
    batches' start times and durations), and how many faults were followed by no batch of some query at all
    (it had read all its input: nothing to judge by)."""
    batches: dict[str, list[tuple[float, float]]] = {}
    for p in progress:
        start = _progress_t(p)
        if start is not None and p.get("duration_ms") is not None:
            batches.setdefault(p["query"], []).append((start, start + p["duration_ms"] / 1000))
    out, idle = [], 0
    for f in faults:
        if not f.get("ok") or f["kind"] == "query-failed":
            continue
        after = f["t"] + f.get("took_s", 0)
        ends = [min((end for start, end in runs if start > after), default=None) for runs in batches.values()]
        if None in ends or not ends:
            idle += 1
        else:
            out.append(max(ends) - f["t"])
    return out, idle


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if t else "?"


def _pct(values: list[float]) -> str:
    if not values:
        return "?"
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    return f"{statistics.median(values) / 1000:.1f} s / {p95 / 1000:.1f} s / {values[-1] / 1000:.1f} s"


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, progress, faults = data["samples"], data["progress"], data["faults"]
    if not samples:
        return
    t0 = samples[0]["t"] - samples[0]["elapsed_s"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    ax = axes[0]
    for name in sorted({p["query"] for p in progress}):
        pts = [((_progress_t(p) or t0) - t0, p["duration_ms"] / 1000) for p in progress
               if p["query"] == name and p.get("duration_ms") is not None and p.get("rows")]
        if pts:
            ax.scatter([x / 60 for x, _ in pts], [y for _, y in pts], s=4, label=name)
    ax.set_ylabel("batch duration (s)")
    ax.set_yscale("log")
    ax.legend(loc="upper left", markerscale=3, fontsize=8)
    ax = axes[1]
    x = [(s["t"] - t0) / 60 for s in samples]
    ax.plot(x, [sum(v for v in s["workers"].values() if v) for s in samples], label="spark_state workers (sum)")
    ax.plot(x, [sum(v for v in s["executors"].values() if v) for s in samples], label="executor JVMs (sum)")
    ax.plot(x, [s["driver_jvm"] or 0 for s in samples], label="driver JVM")
    ax.set_ylabel("RSS (MiB)")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[2]
    ax.plot(x, [s["s3_objects"] for s in samples], label="objects under state/")
    ax.set_ylabel("state files on S3")
    ax2 = ax.twinx()
    ax2.plot(x, [s["s3_mib"] for s in samples], color="tab:orange", label="MiB")
    ax2.set_ylabel("MiB")
    ax.set_xlabel("minutes")
    for f in faults:
        for a in axes:
            a.axvline((f["t"] - t0) / 60, color="red" if f["kind"] != "query-failed" else "black", alpha=0.15, lw=0.8)
    axes[0].set_title("soak: batch duration, memory, state files (red lines: faults, black: query failures)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
