"""Runtime verification of a promoted kernel: sample its calls, check them, report.

``Guard.from_certificate(certificate, spec, ...)`` wraps the callable that
launches a certified kernel (``guard.wrap(fn)`` or ``@guard``). See
:mod:`kcert.guard.guard` for the design and :mod:`kcert.guard.binding` for how a
call's arguments map onto the spec.
"""

from kcert.guard.binding import CertifiedKernel
from kcert.guard.check import Mismatch
from kcert.guard.errors import GuardError
from kcert.guard.guard import Guard, GuardStats
from kcert.guard.latency import BOUNDS_US, LatencyHistogram
from kcert.guard.report import HttpReporter, ListReporter, ObservationReport, Reporter
from kcert.guard.sampler import OutlierDetector, Sampler

__all__ = [
    "BOUNDS_US",
    "CertifiedKernel",
    "Guard",
    "GuardError",
    "GuardStats",
    "HttpReporter",
    "LatencyHistogram",
    "ListReporter",
    "Mismatch",
    "ObservationReport",
    "OutlierDetector",
    "Reporter",
    "Sampler",
]
