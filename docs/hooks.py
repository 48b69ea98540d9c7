"""The parts of the user guide generated from the code, so they cannot drift from it, and read the same on
GitHub (which shows docs/*.md as committed) and in the built site (mkdocs hooks).

Generated blocks are committed between two comments; ``make docs-sync`` (``python docs/hooks.py``) rewrites
them, ``python docs/hooks.py --check`` (and tests/docs/test_rendering.py) fails when one is stale, and the
site build renders them afresh:

- ``<!-- begin generated: options-table -->``: every option of spark_state/options.py (``documented()``).
- ``<!-- begin generated: module-spec spark_state.format.datafile -->``: a format module's docstring, the
  byte-level spec it owns.
- ``<!-- begin generated: include conf/spark-defaults.conf properties -->``: a file of the tree, fenced.

each ending with ``<!-- end generated -->``. A block ``<!-- site-include: CHANGELOG.md -->`` ...
``<!-- end site-include -->`` is a link on GitHub and the file itself in the site. The benchmark plots of
benchmarks/results/*.png are linked where they are committed (``../benchmarks/results/x.png``) and
published in the site as ``img/x.png``.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PLOTS = ROOT / "benchmarks" / "results"
_GENERATED = re.compile(r"(<!-- begin generated: (?P<what>[^>]+?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
_SITE_INCLUDE = re.compile(r"<!-- site-include: (?P<path>\S+) -->\n.*?<!-- end site-include -->\n?", re.S)
_PLOT = re.compile(r"\]\(\.\./benchmarks/results/([\w.-]+\.png)\)")
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


def include(path: str, lang: str) -> str:
    return f"```{lang}\n{(ROOT / path).read_text().rstrip()}\n```"


def render(what: str) -> str:
    """The Markdown of one generated block, from its comment's words."""
    kind, *args = what.split()
    makers = {"options-table": options_table, "module-spec": module_spec, "include": include}
    if kind not in makers:
        raise ValueError(f"unknown generated block {what!r}; known: {', '.join(makers)}")
    return makers[kind](*args)


def sync(markdown: str) -> str:
    """`markdown` with every generated block rendered afresh."""
    return _GENERATED.sub(lambda m: f"{m.group(1)}{render(m.group('what'))}\n{m.group(4)}", markdown)


def for_site(markdown: str) -> str:
    """What the site shows: generated blocks afresh, site-includes expanded, plots where the site has them."""
    markdown = _SITE_INCLUDE.sub(lambda m: (ROOT / m.group("path")).read_text(), sync(markdown))
    return _PLOT.sub(r"](img/\1)", markdown)


def stale_pages() -> list[Path]:
    return [page for page in sorted(DOCS.glob("*.md")) if sync(page.read_text()) != page.read_text()]


# ------------------------------------------------------------------ mkdocs hooks

def on_page_markdown(markdown: str, **_) -> str:
    return for_site(markdown)


def on_files(files, config, **_):
    from mkdocs.structure.files import File

    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"img/{plot.name}", abs_src_path=str(plot)))
    return files


# ------------------------------------------------------------------ make docs-sync

def main(argv: list[str]) -> int:
    stale = stale_pages()
    if "--check" in argv:
        for page in stale:
            print(f"{page.relative_to(ROOT)}: generated blocks are stale; run make docs-sync", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(sync(page.read_text()))
        print(f"rewrote the generated blocks of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
