"""Turns benchmark records into results.md, results.json and PNG charts.

A record is one measured number: {scenario, metric, label, unit, better, size, provider, value}.
Every ratio is ``spark_state value / peer value`` of the same metric, size and run;
``better`` says which direction wins ("lower" for times and bytes, "higher" for rows/s).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

from benchmarks.providers import OURS, PEERS

SCENARIO_TITLES = OrderedDict([
    ("micro", "1. Provider micro-benchmark (in the JVM)"),
    ("restore", "2. Restore after restart"),
    ("checkpoint", "3. Checkpoint size on disk"),
    ("agg", "4. End-to-end streaming aggregation (state-heavy)"),
    ("pandas", "5. End-to-end applyInPandasWithState (UDF-heavy)"),
    ("memory", "6. Memory per state row"),
])


def fmt_size(n) -> str:
    if n is None or n == "":
        return ""
    if isinstance(n, str):
        return n
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def fmt_value(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if unit == "%":
        return f"{100 * v:.1f}%"
    if unit == "MiB":
        return f"{v / 2**20:.2f}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def ratio(ours, peer):
    if ours is None or peer is None:
        return None
    if peer == 0:
        return None if ours != 0 else 1.0
    return ours / peer


def wins(r, better: str) -> bool | None:
    if r is None:
        return None
    return r < 1 if better == "lower" else r > 1


def fmt_ratio(r, better: str) -> str:
    if r is None:
        return "–"
    mark = " ✓" if wins(r, better) else ""
    if r >= 100 or r < 0.01:
        return f"{r:.3g}×{mark}"
    return f"{r:.2f}×{mark}"


def group_ratio(g: dict, ours: str, peer: str):
    """Ratio for one table row; none when a per-row byte count is ~0 on either side (a ratio of noise)."""
    a, b = g["values"].get(ours), g["values"].get(peer)
    if g["unit"] == "B" and a is not None and b is not None and min(a, b) < 4:
        return None
    return ratio(a, b)


def table_rows(records: list[dict]):
    """Groups records by (scenario, metric, size) in first-seen order: {provider: value}."""
    groups: OrderedDict = OrderedDict()
    for r in records:
        key = (r["scenario"], r["metric"], r["size"])
        g = groups.setdefault(key, {"scenario": r["scenario"], "metric": r["metric"], "label": r["label"],
                                    "unit": r["unit"], "better": r["better"], "size": r["size"], "values": {}})
        g["values"][r["provider"]] = r["value"]
    return list(groups.values())


def write_markdown(path: Path, meta: dict, providers: list, records: list[dict]) -> None:
    labels = {p["name"]: p["label"] for p in providers}
    present = [p["name"] for p in providers]
    ours = [n for n in OURS if n in present]
    peers = [n for n in PEERS if n in present]
    rows = table_rows(records)
    lines = [f"# spark_state benchmarks ({meta['profile']})", ""]
    lines += [f"Run {meta['started']} on {meta['host']} ({meta['cpus']} CPUs, {meta['mem_gib']} GiB), "
              f"Spark {meta['spark']}, git {meta['git']}. Wall time {meta['wall_s'] / 60:.1f} min.", ""]
    lines += ["**Ratios are spark_state ÷ peer** for the same metric, size and run. "
              "`better` says which way wins: for *lower* (times, bytes) a ratio below 1 means spark_state "
              "is better, for *higher* (rows/s) a ratio above 1 does. ✓ marks a spark_state win.", ""]
    for note in meta.get("notes", []):
        lines.append(f"- {note}")
    lines.append("")
    if meta.get("skipped"):
        lines += ["## Skipped / failed", ""]
        for s in meta["skipped"]:
            lines.append(f"- {s}")
        lines.append("")

    short = {"hdfs": "HDFS", "rocksdb": "RocksDB", "rocksdb_changelog": "RocksDB+cl",
             "spark_state_fs": "ss-fs", "spark_state_mem": "ss-mem"}
    if ours and peers:
        lines += ["## Ratios (spark_state ÷ peer)", ""]
        head = ["Scenario", "Metric", "Size", "better"] + [f"{short[o]}/{short[p]}" for o in ours for p in peers]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for g in rows:
            cells = [g["scenario"], g["label"], fmt_size(g["size"]), g["better"]]
            for o in ours:
                for p in peers:
                    cells.append(fmt_ratio(group_ratio(g, o, p), g["better"]))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    lines += ["## Absolute values", ""]
    head = ["Scenario", "Metric", "Size", "unit"] + [labels[n] for n in present]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for g in rows:
        cells = [g["scenario"], g["label"], fmt_size(g["size"]), g["unit"]]
        cells += [fmt_value(g["values"].get(n), g["unit"]) for n in present]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += ["Scenarios: " + "; ".join(f"`{k}` = {v}" for k, v in SCENARIO_TITLES.items()) + ".", ""]
    if meta.get("charts"):
        lines += ["## Charts", ""] + [f"- `{c}`" for c in meta["charts"]] + [""]
    path.write_text("\n".join(lines))


def write_json(path: Path, meta: dict, providers: list, records: list[dict], raw: dict) -> None:
    present = [p["name"] for p in providers]
    ratios = []
    for g in table_rows(records):
        for o in OURS:
            for p in PEERS:
                if o in present and p in present:
                    r = group_ratio(g, o, p)
                    ratios.append({"scenario": g["scenario"], "metric": g["metric"], "size": g["size"],
                                   "ours": o, "peer": p, "ratio": r, "better": g["better"],
                                   "spark_state_wins": wins(r, g["better"])})
    path.write_text(json.dumps({"meta": meta, "providers": providers, "records": records,
                                "ratios": ratios, "raw": raw}, indent=1, default=str))


COLORS = {"hdfs": "#4c72b0", "rocksdb": "#dd8452", "rocksdb_changelog": "#c44e52",
          "spark_state_fs": "#55a868", "spark_state_mem": "#8172b3"}


def write_charts(out: Path, providers: list, records: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {p["name"]: p["label"] for p in providers}
    present = [p["name"] for p in providers]
    rows = table_rows(records)
    files = []

    # Headline: ratios of each spark_state storage against each peer, green = spark_state wins.
    ours = [n for n in OURS if n in present]
    peers = [n for n in PEERS if n in present]
    if ours and peers:
        names = [f"{g['scenario']}: {g['label']} @ {fmt_size(g['size'])}".rstrip(" @") for g in rows]
        fig, axes = plt.subplots(1, len(ours) * len(peers), figsize=(4.2 * len(ours) * len(peers), 0.28 * len(rows) + 1.6),
                                 sharey=True, squeeze=False)
        for i, (o, p) in enumerate([(o, p) for o in ours for p in peers]):
            ax = axes[0][i]
            vals, colors = [], []
            for g in rows:
                r = group_ratio(g, o, p)
                vals.append(r if r and r > 0 else float("nan"))
                w = None if r is not None and abs(r - 1) < 0.005 else wins(r, g["better"])   # exact tie: grey
                colors.append("#55a868" if w else "#c44e52" if w is not None else "#999999")
            ax.barh(range(len(rows)), vals, color=colors, left=0)
            ax.axvline(1.0, color="black", lw=0.8)
            ax.set_xscale("log")
            ax.set_title(f"{labels[o]}\n÷ {labels[p]}", fontsize=9)
            ax.tick_params(axis="x", labelsize=7)
            for y, v in enumerate(vals):
                if v == v:
                    ax.text(v, y, f" {v:.2g}", va="center", fontsize=6)
        axes[0][0].set_yticks(range(len(rows)))
        axes[0][0].set_yticklabels(names, fontsize=7)
        axes[0][0].invert_yaxis()
        fig.suptitle("spark_state ÷ peer (log scale; green = spark_state better, red = peer better, grey = tie)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "ratios.png", dpi=110)
        plt.close(fig)
        files.append("ratios.png")

    # Absolute values, one chart per scenario, one panel per metric, grouped by size.
    for scen, title in SCENARIO_TITLES.items():
        srows = [g for g in rows if g["scenario"] == scen]
        if not srows:
            continue
        metrics = list(OrderedDict((g["metric"], None) for g in srows))
        ncols = min(3, len(metrics))
        nrows = math.ceil(len(metrics) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.2 * nrows), squeeze=False)
        for k, m in enumerate(metrics):
            ax = axes[k // ncols][k % ncols]
            mrows = [g for g in srows if g["metric"] == m]
            width = 0.8 / max(1, len(present))
            for j, n in enumerate(present):
                xs = [i + j * width for i in range(len(mrows))]
                ys = [g["values"].get(n) or 0 for g in mrows]
                if g_unit_is_pct(mrows):
                    ys = [100 * y for y in ys]
                ax.bar(xs, ys, width, label=labels[n], color=COLORS.get(n))
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(mrows))])
            ax.set_xticklabels([fmt_size(g["size"]) or "-" for g in mrows], fontsize=8)
            unit = mrows[0]["unit"]
            ax.set_title(f"{mrows[0]['label']} [{unit}] ({mrows[0]['better']} is better)", fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
        for k in range(len(metrics), nrows * ncols):
            axes[k // ncols][k % ncols].axis("off")
        handles, hl = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, hl, loc="lower center", ncol=len(present), fontsize=8)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        name = f"{scen}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files


def g_unit_is_pct(mrows) -> bool:
    return bool(mrows) and mrows[0]["unit"] == "%"
