"""A job's deadline: CPU seconds of the worker's process tree, under a wall-clock ceiling.

A deadline in wall-clock seconds makes a verdict depend on what else the
machine runs: at a load average of 9 the Triton interpreter gets a fraction of
a core, and a correct kernel that needs 20 s of CPU misses a 60 s deadline. So
the sandbox charges a job the CPU time its worker used since the job was sent,
read from ``/proc`` (Linux) and polled while it waits for the answer:

- every process under the worker's root process counts (bwrap, the PID
  namespace's init, the worker, a compiler or anything else it started, and
  their children that already exited, through each parent's ``cutime``);
- the charge is the CPU time of the busiest single thread, or the whole
  tree's CPU time spread over the cores this process may use, whichever is
  more. Not the plain sum: a BLAS library's idle threads spin-wait between
  calls (OpenBLAS under the interpreter's ``tl.dot``), so on a 16-core machine
  a run would be charged up to 16 CPU-seconds per second of its work, a false
  alarm of another kind. Both terms are a lower bound on the time the job
  would take on a machine of its own, and neither grows when the worker only
  waits for a core. A thread cannot use more than one CPU-second a second, so
  an infinite loop is killed after ``cpu_s`` of CPU;
- a worker that blocks without using CPU (a sleep, a deadlock, a device
  synchronization that yields) is killed at the wall ceiling,
  :data:`WALL_CEILING_FACTOR` times ``cpu_s``.

Why 4: a run that needs the whole deadline of CPU still finishes as long as it
gets a quarter of a core, i.e. up to a load of 4 runnable threads per core
(the false alarm of issue 13 was a load of about 9 on 2 cores, a share near
1/4, for a run that needed far less than its deadline: a run that needs half
its deadline survives an 8-fold slow-down); and a worker that blocks holds the
certification up for at most 4 deadlines (4 minutes at the default 60 s; the
pipeline stops probing after a timeout). A bigger factor buys tolerance of
heavier load with a longer wait on every kernel that blocks.

GPU executors use the same rule. While a CUDA or Triton kernel runs on the
device, the launching thread waits in a synchronization that spins (CUDA's
default when the process has fewer contexts than the machine has cores), so
the device time shows as that thread's CPU time and a device hang is killed
after ``cpu_s`` on an idle machine; where the runtime yields or blocks
instead, the ceiling kills it. The host side of a GPU run (Triton's compiler,
``ptxas``, the launcher's C build) is CPU work that load slows, which a wall
deadline would count against the kernel. Under load a spinning thread gets
less CPU, so a device kernel slower than the deadline may be killed later than
on an idle machine, never sooner: the deadline catches hangs; speed is what
the ``timing`` check judges.

What a hostile worker can do about the count: hide CPU from it (threads that
each spin briefly and exit, children reaped with ``SIGCHLD`` ignored, or,
without the sandbox, processes that leave the tree), never escape the wall
ceiling, which holds whatever the count says. Where ``/proc`` cannot be read,
wall time is charged instead (the old rule).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

#: The wall-clock ceiling is this many times the CPU deadline (see the module's docstring).
WALL_CEILING_FACTOR = 4.0
#: The longest wait between two readings of the tree's CPU time.
_POLL_S = 0.5
#: The shortest: a reading costs the certifier a few file reads per thread.
_MIN_POLL_S = 0.01


@dataclass(frozen=True, slots=True)
class Deadline:
    """How much a job may use: ``cpu_s`` CPU seconds, and the wall ceiling above it."""

    cpu_s: float

    def __post_init__(self) -> None:
        if not self.cpu_s > 0:
            raise ValueError("a deadline must be a positive number of CPU seconds")

    @property
    def wall_s(self) -> float:
        return self.cpu_s * WALL_CEILING_FACTOR


@dataclass(frozen=True, slots=True)
class Overrun:
    """Which limit ended the wait, and what the job had used by then."""

    limit: Literal["cpu", "wall"]
    cpu_s: float
    wall_s: float


@dataclass(frozen=True, slots=True)
class TreeUsage:
    """One reading of a process tree's CPU seconds."""

    #: Every process in the tree, each with all its threads and its reaped children.
    total_s: float
    #: Each live thread's own CPU seconds, by (host thread id, start time in ticks).
    threads: dict[tuple[int, int], float]


class TreeClock:
    """What the process tree under ``root`` has used since this clock was made."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.started = time.monotonic()
        self._cores = _cores()
        self._base = read_tree(root)

    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def cpu_s(self) -> float:
        """The CPU charged since the start: the busiest thread, or the total over the cores."""
        now = read_tree(self.root)
        if now is None or self._base is None:
            return self.wall_s()  # /proc cannot tell: charge the wall clock
        base = self._base.threads
        busiest = max((s - base.get(key, 0.0) for key, s in now.threads.items()), default=0.0)
        spread = (now.total_s - self._base.total_s) / self._cores
        return max(0.0, busiest, spread)


def wait(ready: Callable[[float], bool], clock: TreeClock, deadline: Deadline) -> Overrun | None:
    """Wait until ``ready(until)`` sees the answer (None), or until a limit of ``deadline``.

    ``ready`` is called with a monotonic time to wait until at most, as
    :meth:`kcert.certify.frames.Frames.ready` takes it; between its calls the
    tree's CPU time is read. The charge grows by at most one second a second,
    so each wait is as long as the CPU left (at most :data:`_POLL_S`): the kill
    comes within a poll of the deadline, not a poll past it.
    """
    ceiling = clock.started + deadline.wall_s
    left = deadline.cpu_s
    while True:
        now = time.monotonic()
        step = min(_POLL_S, max(_MIN_POLL_S, left), max(0.0, ceiling - now))
        if ready(now + step):
            return None
        used = clock.cpu_s()
        if used >= deadline.cpu_s:
            return Overrun("cpu", used, clock.wall_s())
        if time.monotonic() >= ceiling:
            return Overrun("wall", used, clock.wall_s())
        left = deadline.cpu_s - used


def read_tree(root: int) -> TreeUsage | None:
    """The CPU seconds of ``root`` and every process below it; None when ``root`` is gone.

    A parent is read before its children: a child reaped between the two
    readings is then missing from both (its time shows at the next reading, in
    its parent's ``cutime``), never counted twice.
    """
    ticks = float(os.sysconf("SC_CLK_TCK"))
    children = _children if _children_files() else _scan_children()
    total = 0
    threads: dict[tuple[int, int], float] = {}
    todo, seen = [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        fields = _stat(f"/proc/{pid}/stat")
        if fields is None:
            if pid == root:
                return None
            continue  # exited since its parent was read
        total += sum(fields[11:15])  # utime, stime, cutime, cstime (fields 14 to 17)
        tids = _tasks(pid)
        for tid in tids:
            task = _stat(f"/proc/{pid}/task/{tid}/stat")
            if task is not None:
                threads[(tid, task[19])] = (task[11] + task[12]) / ticks  # its own, and start
        todo.extend(children(pid, tids))
    return TreeUsage(total / ticks, threads)


def _stat(path: str) -> list[int] | None:
    """A stat file's numeric fields from the state on (field 3 at index 0); None if gone."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the name, field 2, is in parentheses and may hold spaces and parentheses itself
    after = raw.rpartition(b")")[2].split()
    try:
        return [0, *(int(v) for v in after[1:])]
    except ValueError:
        return None


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def _children(pid: int, tids: list[int]) -> list[int]:
    """The children of the threads ``tids`` of ``pid`` (``/proc/PID/task/TID/children``)."""
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


@functools.cache
def _children_files() -> bool:
    """Whether this kernel has ``/proc/PID/task/TID/children`` (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _scan_children() -> Callable[[int, list[int]], list[int]]:
    """Children by parent from one pass over every process (where the children files lack)."""
    by_parent: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(f"/proc/{name}/stat")
            if fields is not None:
                by_parent.setdefault(fields[1], []).append(int(name))
    return lambda pid, _tids: by_parent.get(pid, [])


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except OSError:
        return os.cpu_count() or 1
