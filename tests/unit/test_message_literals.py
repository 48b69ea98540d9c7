"""A message split over lines as adjacent string literals (``"...storage" "is..."`` in Python, ``"..." + "..."`` in
Java) joins without a space unless one side has it: this scan finds the joins that run two words together."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import ROOT

#: String literals and comments, so quotes inside comments (and comment markers inside strings) are skipped.
PYTHON = re.compile(r"#[^\n]*|(?<!\w)(?i:[rbfu]{0,2})(\"\"\"|'''|\"|')((?:\\.|(?!\1)[^\\])*)\1", re.S)
JAVA = re.compile(r"//[^\n]*|/\*.*?\*/|(\")((?:\\.|[^\"\\\n])*)\"|'(?:\\.|[^'\\\n])+'", re.S)
#: Between two literals that join: a line break, in Java with the `+`.
JOIN = {PYTHON: re.compile(r"\s*\n\s*"), JAVA: re.compile(r"\s*\+\s*\n\s*\+?\s*|\s*\n\s*\+\s*")}


def _runs_together(left: str, right: str) -> bool:
    """Two words, or a sentence's punctuation and the next word, with no space between (the texts are the source's:
    a line break is still its escape)."""
    if not left or not right or left.endswith(("\\n", "\\t")):
        return False
    return (left[-1].isalnum() and right[0].isalnum()) or (left[-1] in ",;:!?)" and right[0].isalpha()) \
        or (left[-1] == "." and right[0].isupper())


def joins_without_space(text: str, syntax: re.Pattern) -> list[str]:
    """`left|right` of each pair of literals that join across a line break and run words together."""
    found, prev = [], None
    for m in syntax.finditer(text):
        if m.group(1) is None:      # a comment, or a Java char literal
            prev = None if not m.group().startswith(("#", "//", "/*")) else prev
            continue
        if prev is not None and JOIN[syntax].fullmatch(text, prev.end(), m.start()) \
                and _runs_together(prev.group(2), m.group(2)):
            found.append(f"line {text.count(chr(10), 0, m.start()) + 1}: {prev.group(2)[-30:]}|{m.group(2)[:30]}")
        prev = m
    return found


def test_the_scan_finds_words_run_together_and_nothing_else():
    assert joins_without_space('raise X("HDFS storage"\n        "is missing")\n', PYTHON) == [
        "line 2: HDFS storage|is missing"]
    assert joins_without_space('throw new X("HDFS storage"\n    + "is missing");\n', JAVA) == [
        "line 2: HDFS storage|is missing"]
    fine = 'x = ("one "\n     "two", "three"\n     f" four")  # "a"\n    "b"\ny = ("k="\n  "v", "1.\\n"\n  "2")\n'
    assert joins_without_space(fine, PYTHON) == []


def test_no_message_in_the_sources_runs_words_together():
    found = {str(path.relative_to(ROOT)): hits
             for pattern, syntax in (("spark_state/**/*.py", PYTHON), ("jvm-shim/**/*.java", JAVA))
             for path in sorted(ROOT.glob(pattern))
             if (hits := joins_without_space(path.read_text(encoding="utf-8"), syntax))}
    assert not found, f"adjacent string literals that run words together (add the space): {found}"
