"""Which calls the guard checks: a fixed rate, and always the unusual ones.

Two rules decide, on the caller's thread and before the call (the inputs must
be copied before a kernel can write over them):

* **Rate.** A seeded :class:`random.Random` draws one number per call; a call is
  sampled when it falls below ``rate``. With a seed the sequence of decisions is
  reproducible, which the tests and a replayed incident rely on.
* **Outliers.** An exponential running centroid over a small feature vector per
  call, with an exponential running variance per feature, as
  cuda-kernel-verifier does. A call whose features lie more than ``threshold``
  standard deviations from the centroid (the largest per-feature z, so one
  unusual dimension is enough) is always sampled.

The features are the log2 of every extent of every buffer (a shape 10× larger
moves its feature by 3.3), and per float buffer ``log2(1 + max|x|)``, the mean,
the standard deviation and the fraction of non-finite elements. The value
features are taken over at most :data:`SUBSAMPLE` elements picked at a fixed
stride, so deciding costs the same for a buffer of 10^3 or 10^9 elements
(:mod:`kcert.guard.arrays`): a spike confined to a few elements can be missed
by it; the fixed-rate sample still reaches those calls.

Each variance has a floor (:data:`MIN_STD` squared), so that after a warm-up of
identical shapes (variance zero) an off-by-one extent is not an outlier while a
doubling is. Nothing is flagged during the first ``warmup`` calls, and every
call, flagged or not, then moves the centroid: a shift in the traffic is
flagged while it is new and becomes normal as it persists.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

#: A feature's standard deviation is at least this (in its own units: log2 for sizes).
MIN_STD = 0.25
#: Weight of a new call in the running centroid and variance.
ALPHA = 0.05
WARMUP = 16
THRESHOLD = 4.0


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a call is checked: by the rate, as an outlier, or both (or neither)."""

    by_rate: bool
    outlier: bool

    @property
    def sampled(self) -> bool:
        return self.by_rate or self.outlier


class OutlierDetector:
    """The running centroid and variance of feature vectors, and the z-distance test.

    A call whose feature vector changes length (another layout of arguments) starts a
    new centroid: the old one describes calls that no longer come.
    """

    def __init__(self, *, alpha: float = ALPHA, warmup: int = WARMUP,
                 threshold: float = THRESHOLD, min_std: float = MIN_STD) -> None:  # fmt: skip
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha, self.warmup, self.threshold = alpha, warmup, threshold
        self._floor = min_std * min_std
        self._mean: list[float] = []
        self._var: list[float] = []
        self._seen = 0

    def distance(self, features: Sequence[float]) -> float:
        """The largest per-feature z of ``features`` against the centroid (inf if new)."""
        if len(features) != len(self._mean):
            return math.inf
        worst = 0.0
        for x, m, v in zip(features, self._mean, self._var, strict=True):
            z = abs(x - m) / math.sqrt(max(v, self._floor))
            worst = max(worst, z)
        return worst

    def observe(self, features: Sequence[float]) -> bool:
        """Fold ``features`` into the centroid; whether they were an outlier before that."""
        if len(features) != len(self._mean):
            self._mean = [f if math.isfinite(f) else 0.0 for f in features]
            self._var, self._seen = [0.0] * len(features), 1
            return False
        # one pass, no square roots: this runs on every call of the guarded kernel
        a, floor, limit = self.alpha, self._floor, self.threshold * self.threshold
        mean, var = self._mean, self._var
        far = False
        for i, x in enumerate(features):
            if x != x or x in (math.inf, -math.inf):
                x = 0.0
            delta = x - mean[i]
            v = var[i]
            far = far or delta * delta > limit * (v if v > floor else floor)
            mean[i] += a * delta
            # West's exponentially weighted variance: stays non-negative, no second pass
            var[i] = (1 - a) * (v + a * delta * delta)
        flagged = far and self._seen >= self.warmup
        self._seen += 1
        return flagged


class Sampler:
    """Fixed-rate sampling from a seeded RNG plus the outlier detector; thread-safe."""

    def __init__(self, rate: float, *, seed: int | None = None,
                 detector: OutlierDetector | None = None) -> None:  # fmt: skip
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sample rate must be between 0 and 1, got {rate}")
        self.rate = rate
        self._rng = random.Random(seed)
        self.detector = detector if detector is not None else OutlierDetector()
        self._lock = threading.Lock()

    def decide(self, features: Sequence[float] | None) -> Decision:
        """One call's decision; ``features`` None skips the outlier test (no arrays seen)."""
        with self._lock:
            by_rate = self.rate > 0.0 and self._rng.random() < self.rate
            outlier = self.detector.observe(features) if features is not None else False
        return Decision(by_rate, outlier)
