"""Kernels that misbehave in ways the sandbox must contain (not certification assets).

``TRITON_INTERPRET=1`` is set in the worker, so the ``@triton.jit`` kernels here
run in the interpreter. The plain-Python launchers imitate a kernel's launch
(``fn[grid](*args)``) so that a test can make the child segfault or abort at
launch time, as a broken native extension or a driver fault would.
"""

import ctypes
import os
import subprocess
import sys
import time

import triton
import triton.language as tl


@triton.jit
def copy(x, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask), mask=mask)


@triton.jit
def overrun(x, out, n, BLOCK: tl.constexpr):
    # no mask: the last block writes BLOCK - n % BLOCK elements past the end of out
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(x + offsets, mask=offsets < n, other=7.0))
    # and one element before the start
    tl.store(out + offsets - 1, tl.full((BLOCK,), -3.0, tl.float32), mask=offsets == 0)


@triton.jit
def spin(x, out, n, BLOCK: tl.constexpr):
    i = 0
    while i < n:  # n is never changed below: the loop never ends
        i = i * 1
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(x + offsets))


@triton.jit
def undefined_name(x, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, no_such_value + tl.load(x + offsets))  # noqa: F821


class _Launcher:
    """Something that launches like a Triton kernel and then does ``action``."""

    def __init__(self, action):
        self.action = action

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.action()

        return launch


def _segfault():
    ctypes.string_at(0)


#: In the grandchild's command line: the test finds it by this, from outside the sandbox.
GRANDCHILD_MARK = "kcert-test-grandchild-of-a-hung-kernel"


def _hang_with_grandchild():
    # a grandchild that would outlive a careless sandbox, in its own session
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", GRANDCHILD_MARK],
                     start_new_session=True)
    while True:
        time.sleep(0.05)


def _sleep_forever():
    # a hang that uses no CPU: only the deadline's wall ceiling ends it
    while True:
        time.sleep(0.05)


class _Burner:
    """Launches like a Triton kernel and uses ``n`` ms of its thread's CPU: a known cost."""

    def __getitem__(self, grid):
        def launch(x, out, n, *args, **kwargs):
            end = time.thread_time() + n / 1000
            while time.thread_time() < end:
                pass

        return launch


def _exhaust_memory():
    raise MemoryError("could not allocate the kernel's workspace")


def _print_then_exit():
    sys.stdout.write("the kernel says goodbye\n")
    sys.stdout.flush()
    os._exit(0)


def _forge_deep_header():
    # write a frame straight onto the worker's answer pipe: a header nested 100,000 deep
    write_fd = int(sys.argv[2])
    body = b"[" * 100_000 + b"]" * 100_000
    os.write(write_fd, len(body).to_bytes(4, "big") + body)
    while True:
        time.sleep(0.05)


def _forge_huge_frame():
    # a valid "ok" header, then a frame that claims 8 GiB for the first buffer
    write_fd = int(sys.argv[2])
    header = b'{"op": "run", "status": "ok", "message": "", "elapsed_s": 0, "result": null}'
    os.write(write_fd, len(header).to_bytes(4, "big") + header)
    os.write(write_fd, (-1).to_bytes(4, "big", signed=True) + (1 << 33).to_bytes(8, "big"))
    while True:
        time.sleep(0.05)


def _flood_stdout():
    # 256 MiB to stdout: the worker's log is a file on the host, bounded by RLIMIT_FSIZE
    chunk = b"x" * (1 << 20)
    for _ in range(256):
        os.write(1, chunk)


segfault = _Launcher(_segfault)
flood_stdout = _Launcher(_flood_stdout)
deep_header = _Launcher(_forge_deep_header)
huge_frame = _Launcher(_forge_huge_frame)
abort = _Launcher(os.abort)
hang_with_grandchild = _Launcher(_hang_with_grandchild)
out_of_memory = _Launcher(_exhaust_memory)
exits = _Launcher(_print_then_exit)
sleeps = _Launcher(_sleep_forever)
burns_n_ms = _Burner()
