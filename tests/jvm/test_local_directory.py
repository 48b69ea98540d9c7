"""An executor's folder on local disk (LocalDirectory.java, through tests/jvm/EngineProbe.java): spill runs and
copies of remote row images, one folder per JVM, locked while it runs. A killed executor runs no shutdown hook,
and its copies can be gigabytes (rowImages.cacheSize defaults to half the disk): the next executor on the host
deletes its folder, and never the folder of one that still runs, whatever its process id."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.jvm_probes import ProbeProcess, probe_command


@pytest.fixture(scope="module")
def command(tmp_path_factory):
    def started(root: Path) -> ProbeProcess:
        return ProbeProcess(probe_command("EngineProbe.java", "io.sparkstate.shim.engine.EngineProbe", classes,
                                          f"-Djava.io.tmpdir={root}", heap="128m"))

    classes = tmp_path_factory.mktemp("local-probe")
    return started


def local_folder(probe: ProbeProcess) -> Path:
    answer = probe.ask("local")
    assert answer.startswith("OK "), answer
    return Path(answer[3:])


def is_locked(folder: Path) -> bool:
    with open(folder / ".lock", "w") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.lockf(f, fcntl.LOCK_UN)
        return False


def test_a_killed_executor_s_folder_is_deleted_by_the_next_one_and_a_running_one_s_is_not(command, tmp_path):
    root = tmp_path / "local"
    dead = root / "spark-state-local-4242-a1"   # a killed executor's: its lock file, a copy, a spill run
    (dead / "images").mkdir(parents=True)
    (dead / "spill").mkdir()
    (dead / ".lock").touch()
    (dead / "images" / "copy.img").write_bytes(b"\0" * 65536)
    (dead / "spill" / "state-1.img").write_bytes(b"\0" * 4096)
    running = root / "spark-state-local-4242-b2"   # a running executor's (this process holds its lock), same pid
    running.mkdir()
    held = open(running / ".lock", "w")
    fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    foreign = root / "spark-state-local-notes"   # no lock file: not a folder the shim made
    foreign.mkdir()
    try:
        first = command(root)
        mine = local_folder(first)
        assert mine.parent == root and mine.name.startswith("spark-state-local-"), mine
        assert not dead.exists(), "the killed executor's folder was left"
        assert running.exists() and foreign.exists()
        assert is_locked(mine), "a running executor's folder must be locked"
        assert [p.name for p in (mine / "spill").iterdir()], "the spill file was not made in the folder"

        first.proc.kill()   # SIGKILL: no shutdown hook
        first.proc.wait(timeout=30)
        assert mine.exists() and not is_locked(mine)
        second = command(root)
        theirs = local_folder(second)
        assert not mine.exists(), "the next executor left the killed one's folder"
        assert theirs.exists() and theirs != mine and running.exists() and foreign.exists()
        second.close()
        assert not theirs.exists(), "an executor that ends normally deletes its own folder"
    finally:
        held.close()


def test_a_leftover_that_cannot_all_go_keeps_its_lock_file_to_be_tried_again(command, tmp_path):
    """One file of a killed executor's folder resists deletion (immutable here; a busy NFS file, a permission
    elsewhere): the rest goes, and the lock file stays, so the next executor tries again instead of skipping a
    folder that has lost its mark."""
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    root = tmp_path / "local"
    dead = root / "spark-state-local-4242-c3"
    (dead / "images").mkdir(parents=True)
    (dead / ".lock").touch()
    (dead / "images" / "gone.img").write_bytes(b"\0" * 4096)
    stuck = dead / "images" / "stuck.img"
    stuck.write_bytes(b"\0" * 4096)
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("this file system or user cannot make a file immutable")
    try:
        probe = command(root)
        local_folder(probe)
        probe.close()
        assert not (dead / "images" / "gone.img").exists()
        assert stuck.exists() and (dead / ".lock").exists(), "the lock file went before the folder could"
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)
    probe = command(root)
    local_folder(probe)
    probe.close()
    assert not dead.exists(), "the next executor did not finish the job"
