"""The contract between the certifier and the sandboxed executors.

The certifier lays out every buffer on the host as one flat padded array,
``[guard | data | guard]``, already filled with drawn contents and inputs. An executor
copies each padded array to the device verbatim, launches the kernel with a
pointer to the start of the data region (viewed with the buffer's shape),
synchronizes, and copies the whole padded array back. All checks (bounds,
coverage, input integrity, determinism) are then made on the host by the
certifier, so an executor needs no knowledge of them.

Executors run only inside the sandbox's child process; a crash, a sticky CUDA
error or a hang there becomes a :class:`RunOutcome` with a failed status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from kcert.certify.spec import Launch

EXECUTORS: tuple[str, ...] = ("cuda", "triton", "triton-interpreter")


class RunStatus(StrEnum):
    OK = "ok"
    LAUNCH_ERROR = "launch-error"  # the runtime reported an error (sticky or not)
    CRASH = "crash"  # the child died (segfault, abort, killed)
    TIMEOUT = "timeout"  # the child missed its deadline and was killed
    OOM = "out-of-memory"


@dataclass(frozen=True)
class PaddedBuffer:
    """One kernel argument buffer in host memory, with guard bands of drawn contents."""

    name: str
    dtype: str  # a spec dtype: f32, bf16, ...
    shape: tuple[int, ...]
    #: Elements of guard before the data region (and after it: ``len - guard - size``).
    guard: int
    #: ``guard + prod(shape) + guard_after`` elements, 1-D, C-contiguous.
    padded: np.ndarray

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def data(self) -> np.ndarray:
        """The data region viewed with the buffer's shape."""
        return self.padded[self.guard : self.guard + self.size].reshape(self.shape)


@dataclass(frozen=True)
class RunJob:
    """One launch (or ``launches`` back-to-back launches) of the candidate kernel."""

    launch: Launch
    #: In kernel parameter order; scalars and consts come from ``launch``.
    buffers: tuple[PaddedBuffer, ...]
    #: Extra bytes added to every device allocation's start, so that a second
    #: run sees different buffer addresses (the determinism check).
    address_shift: int = 0
    launches: int = 1
    #: Per buffer name, its own shift in place of ``address_shift`` (the drawn conditions).
    buffer_shifts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RunOutcome:
    status: RunStatus
    message: str
    #: The padded arrays after the launch, same layout as the job's; empty on failure.
    buffers: Mapping[str, np.ndarray] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.OK
