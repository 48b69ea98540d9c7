"""docs/monitoring.md documents every metric a spark_state store reports: each custom metric the shim declares
(``Metrics.java``, names resolved through the constants they use) has a row saying what it is and what to do,
and the table has no row for a metric the shim does not report."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

SHIM = ROOT / "jvm-shim" / "src" / "main" / "java"
#: Spark's own StateStoreMetrics that spark_state fills (Metrics.of: numKeys, memoryUsedBytes).
SPARKS = {"numRowsTotal", "memoryUsedBytes"}
_DECLARED = re.compile(r"new StateStoreCustom\w+Metric\(\s*([^,]+),", re.S)
_CONSTANT = re.compile(r"static final String (\w+) = \"([^\"]+)\";")


def declared_metrics() -> set[str]:
    sources = {p.stem: p.read_text() for p in SHIM.rglob("*.java")}
    constants = {f"{cls}.{name}": value for cls, text in sources.items() for name, value in _CONSTANT.findall(text)}
    names = set()
    for arg in _DECLARED.findall(sources["Metrics"]):
        arg = arg.strip()
        names.add(arg.strip('"') if arg.startswith('"') else constants.get(arg, constants.get(f"Metrics.{arg}")))
    assert None not in names and names, f"cannot read the metric names of Metrics.java: {names}"
    return names


def documented_metrics() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "monitoring.md").read_text()
    table = text.split("## The metrics", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `(\w+)`", row).group(1): [c.strip() for c in row.strip("|").split("|")[1:]] for row in rows}


def test_every_metric_the_shim_reports_is_documented_with_what_to_do():
    declared, documented = declared_metrics(), documented_metrics()
    assert {m for m in declared if m.startswith("sparkState")} == declared, "a custom metric without the prefix"
    assert declared | SPARKS == set(documented), (
        f"docs/monitoring.md lacks {sorted(declared | SPARKS - set(documented))}, "
        f"documents unknown {sorted(set(documented) - declared - SPARKS)}")
    for name, (what, todo) in documented.items():
        assert len(what) > 20 and len(todo) > 20, f"{name}: say what it is and what to do about it"
