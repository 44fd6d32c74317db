"""The parent's reads from a child: bounded, under a deadline, never trusting the child."""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pytest
from test_sandbox import job, kernel

from kcert.certify.execution import RunStatus
from kcert.certify.frames import MAX_HEADER_BYTES, Frames, FrameTimeout, ProtocolError
from kcert.certify.sandbox import Sandbox


@pytest.fixture
def pipe() -> tuple[Frames, int]:
    read_fd, write_fd = os.pipe()
    yield Frames(read_fd), write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def test_frames_written_by_a_connection_read_back(pipe: tuple[Frames, int]) -> None:
    frames, write_fd = pipe
    out = Connection(os.dup(write_fd), readable=False)
    out.send_bytes(b'{"ok": true}')
    out.send_bytes(b"x" * 1000)
    out.close()
    deadline = time.monotonic() + 5
    assert frames.header(deadline) == {"ok": True}
    view = np.empty(1000, dtype=np.uint8)
    frames.read_into(view.data, deadline)
    assert bytes(view) == b"x" * 1000


def test_a_body_that_never_comes_times_out_at_the_deadline(pipe: tuple[Frames, int]) -> None:
    frames, write_fd = pipe
    os.write(write_fd, (4096).to_bytes(4, "big") + b"{")
    started = time.monotonic()
    with pytest.raises(FrameTimeout, match="1 of 4096"):
        frames.read(8192, started + 0.5)
    assert time.monotonic() - started < 2


def test_a_length_over_the_limit_is_refused_before_reading_the_body(
    pipe: tuple[Frames, int],
) -> None:
    frames, write_fd = pipe
    os.write(write_fd, (-1).to_bytes(4, "big", signed=True) + (1 << 33).to_bytes(8, "big"))
    with pytest.raises(ProtocolError, match=f"{1 << 33} bytes"):
        frames.read(MAX_HEADER_BYTES, time.monotonic() + 5)


def test_a_buffer_of_the_wrong_size_is_refused(pipe: tuple[Frames, int]) -> None:
    frames, write_fd = pipe
    os.write(write_fd, (9).to_bytes(4, "big") + b"123456789")
    view = np.empty(8, dtype=np.uint8)
    with pytest.raises(ProtocolError, match="9 bytes where 8"):
        frames.read_into(view.data, time.monotonic() + 5)


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"[1, 2]", b"\xff"])
def test_a_header_that_is_not_a_json_object_is_refused(
    pipe: tuple[Frames, int], body: bytes
) -> None:
    frames, write_fd = pipe
    # from a thread: a body larger than the pipe's buffer blocks its writer until read
    writer = threading.Thread(target=os.write, args=(write_fd, len(body).to_bytes(4, "big") + body))
    writer.start()
    with pytest.raises(ProtocolError, match="header"):
        frames.header(time.monotonic() + 5)
    writer.join()


@pytest.mark.parametrize("name", ["deep_header", "huge_frame"])
@pytest.mark.triton
def test_a_kernel_that_forges_frames_fails_launch_and_the_certifier_lives(name: str) -> None:
    started = time.monotonic()
    with Sandbox(kernel(name), "triton-interpreter", deadline_s=20) as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, 8))
        assert sandbox.pid is None  # the lying worker was killed
    assert outcome.status is RunStatus.CRASH
    assert "broke the protocol" in outcome.message
    assert time.monotonic() - started < 20
