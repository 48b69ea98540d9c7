"""The docs read the same where people read them: on GitHub, which shows README.md and docs/*.md as committed,
and in the built site. Generated parts are committed and in sync with the code (docs/hooks.py); every link and
image resolves to a committed file; nothing only mkdocs expands is left in a page."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest

from spark_state.options import PREFIX, documented
from tests.support import doc_examples
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402 - docs/hooks.py, the generator of the guide's generated blocks

PAGES = doc_examples.pages()
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: What only mkdocs (or one of its extensions) would expand: on GitHub it shows as written.
_SITE_ONLY = [re.compile(p, re.M) for p in (r"^--8<--", r"<!-- options-table -->", r"<!-- module-spec:")]


def _outside_code(text: str) -> str:
    return _FENCE.sub("", re.sub(r"`[^`\n]*`", "", text))


def test_generated_blocks_are_committed_and_in_sync_with_the_code():
    assert hooks.stale_pages() == [], "generated blocks of the docs are stale: run make docs-sync and commit"
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for key, keyword, _ in documented():
        assert f"| `{key[len(PREFIX):]}` | `{keyword}` |" in configuration, f"{key} is not in the committed table"
    assert (ROOT / "conf" / "spark-defaults.conf").read_text().strip() in configuration
    assert "Source: `spark_state/format/datafile.py`" in (ROOT / "docs" / "format.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_nothing_only_the_site_expands_is_left_in_the_page(page):
    text = page.read_text()
    for pattern in _SITE_ONLY:
        assert not pattern.search(text), f"{page.name}: {pattern.pattern} shows as written on GitHub"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_table_ends_with_a_blank_line(page):
    """GitHub's Markdown continues a table with the next line that is not blank: a paragraph written right
    under a table shows as one of its rows."""
    lines = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text()).split("\n")
    for i in range(1, len(lines)):
        if lines[i - 1].startswith("|") and lines[i].strip() and not lines[i].lstrip().startswith(("|", "<!--")):
            raise AssertionError(f"{page.name}:{i + 1}: a line right under a table shows as its row: "
                                 f"{lines[i][:60]!r} (leave a blank line after the table)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_and_image_resolves_to_a_committed_file(page):
    for target in _LINK.findall(_outside_code(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name} links {target}, which is not in the tree ({path})"
        assert ROOT in path.parents, f"{page.name} links {target}, outside the repository"


def test_the_site_shows_the_plots_and_the_changelog_where_github_links_them():
    performance = (ROOT / "docs" / "performance.md").read_text()
    plots = re.findall(r"\(\.\./benchmarks/results/([\w.-]+\.png)\)", performance)
    assert plots and all((ROOT / "benchmarks" / "results" / p).exists() for p in plots)
    site = hooks.for_site(performance)
    assert all(f"(img/{p})" in site for p in plots) and "../benchmarks/results/" not in site
    changelog = hooks.for_site((ROOT / "docs" / "changelog.md").read_text())
    assert changelog == (ROOT / "CHANGELOG.md").read_text()


def test_reading_state_says_how_to_install_what_its_examples_use():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {r.split(">")[0] for r in extras["read"]} == {"duckdb", "polars"}
    page = (ROOT / "docs" / "reading-state.md").read_text()
    assert "pip install 'spark_state[read]'" in page
    assert "value.sum" in page and "not the query's" in page


def test_state_on_s3_is_installed_with_the_s3_extra_not_s3fs_by_hand():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["s3"] == [r for r in extras["test"] if r.startswith("s3fs")], "the s3 extra's bound is the tests'"
    recipe = (ROOT / "docs" / "getting-started.md").read_text()
    installs = [line for line in recipe.splitlines() if line.startswith("pip install") and "s3" in line]
    assert installs and all(".whl[s3]'" in line and " s3fs" not in line for line in installs), installs
    assert "pip install 'spark_state[s3]'" in (ROOT / "docs" / "configuration.md").read_text()


def test_operating_lists_every_command_of_spark_state():
    """docs/operating.md's table of the ``spark-state`` command names every subcommand the CLI has."""
    from spark_state.cli import _parser

    commands = next(a for a in _parser()._actions if a.dest == "command").choices
    text = (ROOT / "docs" / "operating.md").read_text()
    missing = [c for c in commands if not re.search(rf"^spark-state {c}\s", text, re.M)]
    assert missing == [], f"docs/operating.md does not list spark-state {missing}"
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        [tools] = re.findall(r"`spark-state ([a-z /]+)`", page.read_text())
        assert set(tools.split(" / ")) == set(commands), f"{page.name}'s Tools row: {tools}"
