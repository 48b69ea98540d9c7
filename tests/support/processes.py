"""Processes found through /proc: the driver JVM, the spark_state workers it started, liveness.

Only processes under this test run's own parents are ever signalled: other applications on the
machine are left alone.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.waiting import wait_until


def driver_jvm_pid(spark) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def ppid(pid: int) -> int | None:
    """The parent of ``pid``, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    """The command line of ``pid``, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(parent: int) -> list[int]:
    """The processes whose parent is ``parent``."""
    return sorted(int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and ppid(int(e.name)) == parent)


def worker_pids(parent: int | None = None) -> list[int]:
    """Live processes running ``spark_state.worker`` (children of ``parent`` if given)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if "spark_state.worker" not in cmdline(pid) or not alive(pid):
            continue
        if parent is None or ppid(pid) == parent:
            out.append(pid)
    return sorted(out)


def sigkill(pid: int, what: str, timeout: float = 15) -> None:
    """SIGKILLs ``pid`` and waits until it is gone (reaped or a zombie)."""
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), timeout, f"{what} (pid {pid}) still alive {timeout}s after SIGKILL")


def kill_workers(spark) -> list[int]:
    """SIGKILLs the spark_state worker(s) of this driver JVM; returns their pids."""
    pids = worker_pids(driver_jvm_pid(spark))
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), 10, f"worker(s) {pids} still alive after SIGKILL")
    return pids
