"""Finding kcert's worker processes from outside their sandboxes (for tests)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def sandboxed_python(outer: int, timeout_s: float = 30.0) -> int:
    """The host pid of the worker's Python process under ``outer`` (bwrap, or a cgroup shell).

    bwrap's own processes carry the worker's command line too; only the Python one,
    inside a nested PID namespace, is the worker.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            python = Path(cmdline[0].decode(errors="replace")).name.startswith("python")
            if not (python and b"kcert.certify.worker" in cmdline and "NSpid:\t" in status):
                continue
            levels = status.split("NSpid:\t", 1)[1].split("\n", 1)[0].split()
            if len(levels) > 1 and _descends(int(pid), outer):
                return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"no sandboxed worker under process {outer}")


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def worker_processes() -> set[int]:
    """Our descendants that run ``kcert.certify.worker`` (bwrap's processes included)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kcert.certify.worker" in cmdline and _descends(int(entry), os.getpid()):
            found.add(int(entry))
    return found
