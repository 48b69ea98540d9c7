"""mkdocs hooks: the parts of the user guide generated from the code, so they cannot drift from it.

- ``<!-- options-table -->``: every option of spark_state/options.py (``documented()``), key, keyword and description.
- ``<!-- module-spec: spark_state.format.datafile -->``: a format module's docstring, the byte-level spec it owns.
- The benchmark plots of benchmarks/results/*.png, published as ``img/<name>.png`` (they stay where the
  benchmarks write them).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "benchmarks" / "results"
_SPEC = re.compile(r"<!-- module-spec: ([\w.]+) -->")
#: A docstring paragraph laid out as a table: a word, two or more spaces, text, then indented lines.
_TABLE = re.compile(r"\A\w+ {2,}\S.*\n {2,}\S")


def options_table() -> str:
    from spark_state.options import PREFIX, documented

    rows = [f"Each option's Spark conf key is `{PREFIX}` followed by its name.", "",
            "| option | `configure()` keyword | meaning |", "|---|---|---|"]
    for key, keyword, description in documented():
        rows.append(f"| `{key[len(PREFIX):]}` | `{keyword}` | {description} |")
    return "\n".join(rows)


def module_spec(module: str) -> str:
    """A module's docstring as Markdown: reST's ``literal`` becomes `literal`, ``::`` blocks stay indented code,
    "term   text" tables keep their layout."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise ValueError(f"{module} has no docstring to publish")
    paragraphs = []
    for paragraph in doc.split("\n\n"):
        if _TABLE.match(paragraph):   # "term    text" lines with hanging indents: keep their layout
            paragraphs.append(f"```text\n{paragraph}\n```")
        else:
            paragraphs.append(re.sub(r"::$", ":", re.sub(r"``([^`]+)``", r"`\1`", paragraph), flags=re.M))
    return f"Source: `{path.relative_to(ROOT)}`\n\n" + "\n\n".join(paragraphs)


def on_page_markdown(markdown: str, **_) -> str:
    markdown = markdown.replace("<!-- options-table -->", options_table())
    return _SPEC.sub(lambda m: module_spec(m.group(1)), markdown)


def on_files(files, config, **_):
    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"img/{plot.name}", abs_src_path=str(plot)))
    return files
