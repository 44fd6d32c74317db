"""The check of sampled calls: reference, tolerance and scope, and the caller left alone."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from guard_factory import CERTIFIED_MAX, certificate_for, pair, saxpy, saxpy_wrong_when_large

from kcert.certify.anchors import anchor
from kcert.certify.report import Status
from kcert.certify.spec import KernelSpec, load_spec
from kcert.guard import Guard, GuardError, ListReporter
from kcert.guard.check import Sample


def test_a_correct_kernel_gives_no_mismatch(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)
    wrapped = guard.wrap(saxpy)
    sizes = [1, 31, 1000, 4097, CERTIFIED_MAX]
    for seed, n in enumerate(sizes):
        wrapped(*pair(n, seed))
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_seen, stats.calls_checked, stats.mismatches, stats.out_of_scope,
            stats.check_errors) == (len(sizes), len(sizes), 0, 0, 0)  # fmt: skip


def test_a_kernel_wrong_past_its_scope_is_a_mismatch_out_of_scope(
    make_guard: Callable[..., Guard],
) -> None:
    reporter = ListReporter(target="prod-a")
    guard = make_guard(sample_rate=1.0, seed=0, reporter=reporter)
    wrapped = guard.wrap(saxpy_wrong_when_large)
    wrapped(*pair(CERTIFIED_MAX, 1))  # inside: right
    x, y = pair(70000, 2)
    x0, y0 = x.copy(), y.copy()
    wrapped(x, y, 2.5, 70000)
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_checked, stats.mismatches, stats.out_of_scope) == (2, 1, 1)
    [report] = [r for r in reporter.body()["reports"] if r["mismatches"]]
    [m] = report["mismatches"]
    assert m["dims"] == {"n": 70000} and m["in_scope"] is False
    assert m["inputs"] == {"x_ptr": str(anchor(x0)), "y_ptr": str(anchor(y0))}
    assert m["outputs"] == {"y_ptr": str(anchor(y))}
    want = (np.float64(2.5) * x0.astype(np.float64) + y0).astype(np.float32)
    assert m["reference"] == {"y_ptr": str(anchor(want))}
    assert m["max_error"] == pytest.approx(float(np.max(np.abs(y.astype(float) - want))))
    assert m["max_ratio"] > 100
    data = base64.b64decode(m["evidence"]["x_ptr"]["data"])
    assert np.array_equal(np.frombuffer(data, np.float32), x0)
    assert report["out_of_scope"] == 1 and report["calls_checked"] == 2


def test_the_callers_result_and_buffers_are_untouched(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)

    def returns(x_ptr: Any, y_ptr: Any, a: float = 2.5, n: Any = None) -> Any:
        saxpy(x_ptr, y_ptr, a)
        return ("result", y_ptr)

    x, y = pair(3000, 5)
    x1, y1 = x.copy(), y.copy()
    plain = returns(x1, y1)
    got = guard.wrap(returns)(x, y)
    assert got[0] == plain[0] and got[1] is y
    assert np.array_equal(y, y1) and np.array_equal(x, x1)


def test_an_exception_of_the_callee_reaches_the_caller_unchanged(
    make_guard: Callable[..., Guard],
) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)
    error = RuntimeError("launch failed")

    def broken(x_ptr: Any, y_ptr: Any) -> None:
        raise error

    with pytest.raises(RuntimeError) as caught:
        guard.wrap(broken)(*pair(10, 0))
    assert caught.value is error


def test_an_error_in_the_check_is_counted_never_raised(
    make_guard: Callable[..., Guard], caplog: pytest.LogCaptureFixture,
) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)

    def fail(sample: Sample) -> Any:
        raise ZeroDivisionError("inside the checker")

    guard.checker.check = fail  # type: ignore[method-assign]
    x, y = pair(100, 0)
    with caplog.at_level(logging.WARNING, logger="kcert.guard"):
        assert guard.wrap(saxpy)(x, y) is None
        assert guard.flush(30)
    stats = guard.stats()
    assert (stats.check_errors, stats.calls_checked, stats.mismatches) == (1, 0, 0)
    assert "inside the checker" in caplog.text


def test_values_outside_the_probed_domain_are_out_of_scope(
    make_guard: Callable[..., Guard],
) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)
    wrapped = guard.wrap(saxpy)
    x, y = pair(1000, 3)
    x[7] = 100.0  # normal(0, 1) was probed out to 5 sigma
    wrapped(x, y)
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_checked, stats.out_of_scope, stats.mismatches) == (1, 1, 0)


def test_another_scalar_is_out_of_scope_and_checked_with_its_value(
    make_guard: Callable[..., Guard],
) -> None:
    reporter = ListReporter()
    guard = make_guard(sample_rate=1.0, seed=0, reporter=reporter)
    wrapped = guard.wrap(saxpy)
    wrapped(*pair(1000, 4), 3.0, 1000)  # the certificate's a is 2.5
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_checked, stats.out_of_scope, stats.mismatches) == (1, 1, 0)


def test_outputs_may_be_returned(make_guard: Callable[..., Guard], spec: KernelSpec) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)

    @guard
    def functional(x_ptr: Any, y_ptr: Any) -> Any:
        return (np.float32(2.5) * x_ptr + y_ptr) * np.float32(1.0 if x_ptr.size < 50 else 2.0)

    x, y = pair(10, 0)
    assert np.array_equal(functional(x, y), np.float32(2.5) * x + y)
    functional(*pair(100, 0))
    assert guard.flush(30)
    assert (guard.stats().calls_checked, guard.stats().mismatches) == (2, 1)


def test_a_spec_the_certificate_was_not_made_from_is_refused(
    spec: KernelSpec, certificate: Any,
) -> None:
    other = load_spec(spec.spec_path).kernel("row_sum")
    with pytest.raises(GuardError, match="spec_digest"):
        Guard.from_certificate(certificate, other)


def test_a_failed_certificate_is_refused(spec: KernelSpec) -> None:
    failed = certificate_for(spec, {"n": (1, 10)}, verdict=Status.FAIL)
    with pytest.raises(GuardError, match="verdict fail"):
        Guard.from_certificate(failed, spec)


def test_a_certificate_file_and_spec_path_load(
    spec: KernelSpec, certificate: Any, tmp_path: Any,
) -> None:
    path = tmp_path / "saxpy.cert.json"
    path.write_bytes(certificate.to_bytes())
    with Guard.from_certificate(str(path), str(spec.spec_path), sample_rate=1.0) as guard:
        guard.wrap(saxpy)(*pair(10, 0))
        assert guard.flush(30)
        assert guard.stats().calls_checked == 1


def test_threads_may_share_a_guard(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=0.5, seed=1, queue_size=256)
    wrapped = guard.wrap(saxpy)

    def work(seed: int) -> None:
        for i in range(25):
            wrapped(*pair(64 + i, seed * 100 + i))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert guard.flush(60)
    stats = guard.stats()
    assert stats.calls_seen == 100 and stats.mismatches == 0
    assert stats.calls_checked + stats.dropped == stats.calls_sampled
    assert stats.latency.total == 100


def test_an_adapter_maps_another_signature_onto_the_spec(spec: KernelSpec) -> None:
    row_sum = load_spec(spec.spec_path).kernel("row_sum")
    certificate = certificate_for(row_sum, {"m": (1, 64), "n": (1, 2048)})

    def sums(x: np.ndarray[Any, Any], *, off_by: float = 0.0) -> np.ndarray[Any, Any]:
        return x.sum(axis=1) + np.float32(off_by)

    with Guard.from_certificate(certificate, row_sum, kernel=lambda x, **_: {"x_ptr": x},
                                sample_rate=1.0, seed=0) as guard:  # fmt: skip
        wrapped = guard.wrap(sums)
        x = np.random.default_rng(0).uniform(-1, 1, (8, 300)).astype(np.float32)
        assert np.array_equal(wrapped(x), sums(x))
        wrapped(x, off_by=0.5)
        assert guard.flush(30)
        stats = guard.stats()
    assert (stats.calls_checked, stats.mismatches, stats.out_of_scope) == (2, 1, 0)


def test_empty_windows_are_not_reported(make_guard: Callable[..., Guard]) -> None:
    reporter = ListReporter()
    guard = make_guard(sample_rate=1.0, seed=0, reporter=reporter)
    assert guard.flush(30) and guard.flush(30)
    assert reporter.reports == []
    guard.wrap(saxpy)(*pair(10, 0))
    assert guard.flush(30)
    assert [r.calls_seen for r in reporter.reports] == [1]


def test_shapes_out_of_scope_are_counted_for_every_call(
    make_guard: Callable[..., Guard],
) -> None:
    guard = make_guard(sample_rate=0.0, seed=0)
    wrapped = guard.wrap(saxpy)
    wrapped(*pair(CERTIFIED_MAX + 1, 0))
    wrapped(*pair(CERTIFIED_MAX, 1))
    stats = guard.stats()
    assert (stats.calls_seen, stats.out_of_scope, stats.calls_checked) == (2, 1, 0)


def test_calls_that_do_not_fit_the_spec_pass_through(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=1.0, seed=0)

    @guard
    def anything(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    assert anything(1, "two", key=3) == ((1, "two"), {"key": 3})
    x = np.zeros((4, 4), dtype=np.float32)  # two axes where the spec has one
    assert anything(x, x)[0][0] is x
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_seen, stats.out_of_scope, stats.calls_checked, stats.check_errors) \
        == (2, 2, 0, 0)  # fmt: skip


def test_with_a_key_the_signature_must_verify(spec: KernelSpec, tmp_path: Any) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kcert.attest.errors import VerificationError
    from kcert.attest.keys import write_keypair

    signer = Ed25519PrivateKey.generate()
    certificate = certificate_for(spec, {"n": (1, 100)}, key=signer)
    with Guard.from_certificate(certificate, spec, key=signer.public_key()) as guard:
        assert guard.kernel.contents.id
    other = tmp_path / "other"
    write_keypair(other, passphrase=None)
    with pytest.raises(VerificationError):
        Guard.from_certificate(certificate, spec, key=tmp_path / "other.pub")
