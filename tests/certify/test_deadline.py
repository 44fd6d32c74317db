"""The deadline counts the CPU a real process tree uses, and a wall ceiling catches the rest.

Each test starts real child processes (plain Python, no sandbox) and waits on a
pipe the way the sandbox waits for a worker's answer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kcert.certify import deadline
from kcert.certify.deadline import WALL_CEILING_FACTOR, Deadline, TreeClock, read_tree, wait
from kcert.certify.frames import Frames

SPIN = "x = 0\nwhile True:\n    x += 1\n"
SLEEP = "import time\nwhile True:\n    time.sleep(0.05)\n"
#: Its child spins for 0.4 s of its own CPU and exits; the parent waits for it, then sleeps.
REAPED = (
    "import subprocess, sys, time\n"
    "subprocess.run([sys.executable, '-c', 'import time\\nend = time.thread_time() + 0.4\\n"
    "while time.thread_time() < end: pass'], check=True)\n"
    "print('reaped', flush=True)\n" + SLEEP
)
#: Starts a grandchild that spins, and sleeps itself: the CPU is all below it.
SPINNING_CHILD = (
    f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {SPIN!r}])\n" + SLEEP
)


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    answers: int  # the read end of its answer pipe


@pytest.fixture
def started() -> Iterator[list[Child]]:
    """Children started by a test, each in its own session, all killed after it."""
    children: list[Child] = []
    yield children
    for c in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(c.proc.pid, signal.SIGKILL)
        c.proc.wait()
        if c.proc.stdout is not None:
            c.proc.stdout.close()
        os.close(c.answers)


def child(children: list[Child], code: str) -> tuple[int, Frames]:
    """A Python child running ``code``, and the read end of its answer pipe (fd ``ANSWER``)."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code.replace("ANSWER", str(write))],
                            pass_fds=(write,), start_new_session=True,
                            stdout=subprocess.PIPE)  # fmt: skip
    os.close(write)
    children.append(Child(proc, read))
    return proc.pid, Frames(read)


def test_a_spinning_child_is_stopped_by_its_cpu(started: list[Child]) -> None:
    pid, frames = child(started, SPIN)
    limit = Deadline(0.5)
    over = wait(frames.ready, TreeClock(pid), limit)
    assert over is not None and over.limit == "cpu"
    # never early; late by at most a poll and the lag of reading it
    assert 0.5 <= over.cpu_s < 1.0
    assert over.wall_s >= over.cpu_s  # one thread cannot use more CPU than time passed


def test_a_sleeping_child_is_stopped_at_the_wall_ceiling(
    started: list[Child],
) -> None:  # fmt: skip
    pid, frames = child(started, SLEEP)
    limit = Deadline(0.5)
    over = wait(frames.ready, TreeClock(pid), limit)
    assert over is not None and over.limit == "wall"
    assert over.wall_s >= 0.5 * WALL_CEILING_FACTOR and over.cpu_s < 0.5


def test_the_cpu_of_a_grandchild_counts(started: list[Child]) -> None:
    pid, frames = child(started, SPINNING_CHILD)
    over = wait(frames.ready, TreeClock(pid), Deadline(0.5))
    assert over is not None and over.limit == "cpu"


def test_a_reaped_childs_cpu_stays_counted(started: list[Child]) -> None:
    pid, _ = child(started, REAPED)
    before = read_tree(pid)
    stdout = started[-1].proc.stdout
    assert before is not None and stdout is not None
    assert stdout.readline() == b"reaped\n"
    after = read_tree(pid)
    assert after is not None
    # the child is gone: its 0.4 s are in the parent's cutime now
    assert after.total_s - before.total_s >= 0.4
    assert len(after.threads) == 1


def test_an_answer_ends_the_wait(started: list[Child]) -> None:
    pid, frames = child(started, "import os\nos.write(ANSWER, b'x')\n" + SLEEP)
    assert wait(frames.ready, TreeClock(pid), Deadline(30)) is None


def test_the_scan_finds_the_tree_the_children_files_find(
    started: list[Child], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    pid, _ = child(started, SPINNING_CHILD)
    for _ in range(400):
        usage = read_tree(pid)
        if usage is not None and len(usage.threads) >= 2:
            break
        time.sleep(0.05)
    assert usage is not None and len(usage.threads) >= 2, "the grandchild never started"
    monkeypatch.setattr(deadline, "_children_files", lambda: False)
    scanned = read_tree(pid)
    assert scanned is not None
    assert {tid for tid, _ in scanned.threads} == {tid for tid, _ in usage.threads}


def test_a_tree_that_is_gone_reads_as_none(started: list[Child]) -> None:
    pid, _ = child(started, "pass")
    started[-1].proc.wait()
    assert read_tree(pid) is None


def test_a_deadline_is_positive() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            Deadline(bad)
    assert Deadline(2).wall_s == 2 * WALL_CEILING_FACTOR
