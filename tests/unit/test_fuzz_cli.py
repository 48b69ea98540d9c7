"""Fuzzed ``spark-state`` inputs, as the readers are fuzzed (tests/support/fuzzing.py): every command on a
checkpoint Spark wrote (tests/fixtures/format1) with one of its files damaged any way or deleted, and on
locations of any shape, exits 0, 1 or 2 and lets no exception out; exit 2 comes with one line that is not
the "this is a bug" one. Commands run in this process (``cli.main``) so hypothesis can try many inputs."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from spark_state.cli import main
from tests.support.fuzzing import fuzz_settings, mutations
from tests.support.paths import FIXTURES

SPARK_WROTE = FIXTURES / "format1" / "pandas" / "ckpt-test"
FILES = sorted(str(p.relative_to(SPARK_WROTE)) for p in SPARK_WROTE.rglob("*") if p.is_file())
#: Every command that needs no Spark, with what it writes (OUT) and the batches it may be asked for.
COMMANDS = [["ls"], ["validate"], ["validate", "--batch", "2"], ["inspect", "-o", "0", "-p", "1"],
            ["inspect", "-o", "0", "-p", "0", "--batch", "1"], ["export", "OUT"], ["restore", "OUT"],
            ["restore", "OUT", "--batch", "1"], ["savepoint", "--target", "OUT"], ["rescale", "4"], ["changes"]]


def run(args: list[str], cwd: str) -> tuple[int, str, str]:
    """``spark-state ARGS --no-progress`` in `cwd`: exit code, stdout, stderr (an exception that escapes fails the
    test)."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)   # relative locations resolve in the example's directory
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([*args, "--no-progress"])
            except SystemExit as usage:   # argparse: a location that reads as an option ("-o")
                code = usage.code
    finally:
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()


def check(code: int, stderr: str) -> None:
    assert code in (0, 1, 2), code
    if code == 2:
        lines = stderr.strip().splitlines()
        if lines[0].startswith("usage: "):   # argparse's own: the usage, then one line
            lines = lines[-1:]
        assert len(lines) == 1 and "error: " in lines[0], stderr
        assert "This is a bug" not in lines[0], lines[0]


@fuzz_settings(60)
@given(st.sampled_from(COMMANDS), st.sampled_from(FILES), st.one_of(mutations, st.none()), st.booleans())
def test_every_command_on_a_damaged_checkpoint_exits_0_1_or_2(command, damaged, mutation, json):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(shutil.copytree(SPARK_WROTE, Path(tmp) / "ckpt"))
        target = ckpt / damaged
        if mutation is None:
            target.unlink()
        else:
            target.write_bytes(mutation.apply(target.read_bytes()))
        args = [a.replace("OUT", f"{tmp}/out") for a in command]
        code, _, stderr = run([args[0], str(ckpt), *args[1:], *(["--json"] if json else [])], tmp)
        check(code, stderr)


_locations = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=24).filter(lambda t: "://" not in t),
    st.sampled_from(["", " ", ".", "..", "/", "~", "file:", "file:/", "file://", "file://host/x", "file:relative",
                     "memory://", "memory://nothing/here", "C:\\ckpt", "-", "%s", "[x]", "ckpt\x00", "\udcff"]),
)


@fuzz_settings(120)
@given(st.sampled_from(COMMANDS), _locations, st.sampled_from(["", "/offsets", "/metadata", "/state/0/0/chk-1"]))
def test_every_command_on_a_location_of_any_shape_exits_0_1_or_2(command, location, under):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(shutil.copytree(SPARK_WROTE, Path(tmp) / "ckpt"))
        where = location if not under else f"{ckpt}{under}{location}"
        args = [a.replace("OUT", f"{tmp}/out") for a in command]
        code, _, stderr = run([args[0], where, *args[1:]], tmp)
        check(code, stderr)
