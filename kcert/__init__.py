"""kcert: certify GPU kernels against adversarial probes and gate their deployment.

The public Python API is what ``__all__`` lists: load a kernel spec, certify
it, read the feedback, sign the report into a certificate, verify and compare
certificates, and push them to a registry (embedded or remote). Results are
typed (frozen dataclasses and models), errors are :class:`KcertError` with a
``diagnostics()`` text. Names load on first use (PEP 562), so ``import kcert``
stays cheap for the CLI and for scripts that need only part of it.

Certify a Triton kernel on the CPU (the Triton interpreter), sign the report,
verify it, compare two certificates and store one in an embedded registry;
run from the repository root::

    >>> import contextlib, tempfile
    >>> import kcert
    >>> spec = kcert.load_kernel("examples/triton/kcert.toml", "saxpy")
    >>> options = kcert.CertifyOptions(executor="triton-interpreter", max_probes=3)
    >>> report = kcert.certify_kernel(spec, options)
    >>> print(report.verdict)
    pass
    >>> key = kcert.generate_key()
    >>> certificate = kcert.sign(report, key)
    >>> verified = kcert.verify(certificate, key.public_key())
    >>> print(verified.kernel_name, verified.verdict, verified.keyid[:8] != "")
    saxpy pass True
    >>> print(kcert.diff(certificate, certificate).regressed)
    False
    >>> with contextlib.closing(kcert.open_registry(home=tempfile.mkdtemp())) as registry:
    ...     _ = kcert.trust_key(registry, key.public_key(), name="ci")
    ...     print(registry.push(certificate).created)
    True

A failing kernel's ``report.feedback()`` is the text to hand back to whoever
wrote it (a model in a generate -> verify -> refine loop): the failing checks
on their smallest shape, the first bad element with got, want and allowed
error, and a failed build's compiler error at its source line. See
``examples/refine_loop.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Each public name and the module it lives in, imported only when first asked for.
_EXPORTS: dict[str, str] = {
    # kernel specs
    "load_kernel": "kcert.facade",
    "load_spec": "kcert.certify.spec",
    "KernelSpec": "kcert.certify.spec",
    "SpecFile": "kcert.certify.spec",
    # certification
    "certify_kernel": "kcert.facade",
    "CertifyOptions": "kcert.certify.pipeline",
    "WorkerPool": "kcert.certify.spares",
    "CertificationReport": "kcert.certify.report",
    "CheckResult": "kcert.certify.report",
    "Status": "kcert.certify.report",
    "Verdict": "kcert.certify.report",
    # keys
    "generate_key": "kcert.facade",
    "write_keypair": "kcert.attest.keys",
    "load_private_key": "kcert.attest.keys",
    "load_public_key": "kcert.attest.keys",
    "key_id": "kcert.attest.keys",
    # certificates
    "sign": "kcert.facade",
    "verify": "kcert.facade",
    "inspect": "kcert.facade",
    "write_certificate": "kcert.attest.certificate",
    "read_certificate": "kcert.attest.certificate",
    "certificate_id": "kcert.attest.certificate",
    "Envelope": "kcert.attest.dsse",
    "CertificateContents": "kcert.attest.certificate",
    "VerifiedCertificate": "kcert.attest.certificate",
    "diff": "kcert.facade",
    "CertificateDiff": "kcert.attest.diff",
    "Thresholds": "kcert.attest.diff",
    # registries
    "open_registry": "kcert.facade",
    "trust_key": "kcert.facade",
    "Registry": "kcert.registry.client",
    "EmbeddedRegistry": "kcert.registry.client",
    "RemoteRegistry": "kcert.registry.client",
    "CertificateStored": "kcert.registry.models",
    "GateDecision": "kcert.registry.models",
    # runtime verification after promotion
    "Guard": "kcert.guard",
    "GuardStats": "kcert.guard",
    "GuardError": "kcert.guard.errors",
    "Reporter": "kcert.guard",
    "HttpReporter": "kcert.guard",
    "ListReporter": "kcert.guard",
    "ObservationReport": "kcert.guard",
    # values and errors
    "Digest": "kcert.digest",
    "KcertError": "kcert.errors",
    "SpecError": "kcert.certify.errors",
    "BuildError": "kcert.certify.errors",
    "VerificationError": "kcert.attest.errors",
    "RegistryError": "kcert.registry.errors",
}

__all__ = [
    "__version__",
    "load_kernel", "load_spec", "KernelSpec", "SpecFile", "certify_kernel", "CertifyOptions",
    "WorkerPool",
    "CertificationReport", "CheckResult", "Status", "Verdict", "generate_key", "write_keypair",
    "load_private_key", "load_public_key", "key_id", "sign", "verify", "inspect",
    "write_certificate", "read_certificate", "certificate_id", "Envelope", "CertificateContents",
    "VerifiedCertificate", "diff", "CertificateDiff", "Thresholds", "open_registry", "trust_key",
    "Registry", "EmbeddedRegistry", "RemoteRegistry", "CertificateStored", "GateDecision",
    "Guard", "GuardStats", "GuardError", "Reporter", "HttpReporter", "ListReporter",
    "ObservationReport", "Digest", "KcertError", "SpecError", "BuildError", "VerificationError",
    "RegistryError",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kcert' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from kcert.attest.certificate import (
        CertificateContents,
        VerifiedCertificate,
        certificate_id,
        read_certificate,
        write_certificate,
    )
    from kcert.attest.diff import CertificateDiff, Thresholds
    from kcert.attest.dsse import Envelope
    from kcert.attest.errors import VerificationError
    from kcert.attest.keys import key_id, load_private_key, load_public_key, write_keypair
    from kcert.certify.errors import BuildError, SpecError
    from kcert.certify.pipeline import CertifyOptions
    from kcert.certify.report import CertificationReport, CheckResult, Status, Verdict
    from kcert.certify.spares import WorkerPool
    from kcert.certify.spec import KernelSpec, SpecFile, load_spec
    from kcert.digest import Digest
    from kcert.errors import KcertError
    from kcert.facade import (
        certify_kernel,
        diff,
        generate_key,
        inspect,
        load_kernel,
        open_registry,
        sign,
        trust_key,
        verify,
    )
    from kcert.guard import (
        Guard,
        GuardStats,
        HttpReporter,
        ListReporter,
        ObservationReport,
        Reporter,
    )
    from kcert.guard.errors import GuardError
    from kcert.registry.client import EmbeddedRegistry, Registry, RemoteRegistry
    from kcert.registry.errors import RegistryError
    from kcert.registry.models import CertificateStored, GateDecision
