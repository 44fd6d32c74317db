"""The functions of kcert's public Python API that do more than re-export a library name.

``import kcert`` exposes them (and the library's own types) lazily; see the
package docstring for a runnable example. Each is a thin, typed door into
``certify/``, ``attest/`` or ``registry/``, as the CLI's commands are: it takes
paths or values, calls one library function and returns its typed result.
Bad input raises a :class:`~kcert.errors.KcertError` whose ``diagnostics()``
says what to fix; nothing here prints or exits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kcert.attest.certificate import (
    CertificateContents,
    VerifiedCertificate,
    inspect_envelope,
    load_envelope,
    read_certificate,
    sign_report,
    verify_envelope,
)
from kcert.attest.diff import CertificateDiff, Thresholds, diff_certificates
from kcert.attest.dsse import Envelope
from kcert.attest.keys import generate_private_key, trust_map
from kcert.certify.pipeline import CertifyOptions, Progress, certify
from kcert.certify.report import CertificationReport
from kcert.certify.spares import WorkerPool
from kcert.certify.spec import KernelSpec, resolve_kernel

if TYPE_CHECKING:
    from kcert.registry.client import Registry
    from kcert.registry.models import TrustedKeyPublic

__all__ = [
    "certify_kernel", "diff", "generate_key", "inspect", "load_kernel", "open_registry", "sign",
    "trust_key", "verify",
]  # fmt: skip

#: A certificate as the API takes it: parsed already, or a file to read.
CertificateLike = Envelope | CertificateContents | Path | str
#: The keys a signature may come from: one, several, or by key id.
PublicKeys = Ed25519PublicKey | Iterable[Ed25519PublicKey] | Mapping[str, Ed25519PublicKey]


def load_kernel(path: Path | str, name: str | None = None) -> KernelSpec:
    """The ``[[kernel]]`` ``name`` of a ``kcert.toml`` (or the one whose source ``path`` is)."""
    return resolve_kernel(Path(path), name)


def certify_kernel(kernel: KernelSpec, options: CertifyOptions | None = None, *,
                   progress: Progress | None = None,
                   pool: WorkerPool | None = None) -> CertificationReport:  # fmt: skip
    """Certify ``kernel`` (sandboxed); the report's ``verdict`` and ``feedback()`` say how it went.

    A loop that certifies again and again passes one ``pool``
    (``kcert.WorkerPool(spares=1)``, closed when the loop ends), so that each
    certification finds a sandbox worker that has already imported its stack.
    Named ``certify_kernel`` because ``kcert.certify`` is the package that does the work.
    """
    return certify(kernel, options, progress, pool=pool)


def generate_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key (``kcert.write_keypair`` stores one on disk)."""
    return generate_private_key()


def sign(report: CertificationReport, private_key: Ed25519PrivateKey) -> Envelope:
    """The certificate of ``report``: a DSSE envelope around its in-toto statement."""
    return sign_report(report, private_key)


def verify(certificate: Envelope | Path | str, public_keys: PublicKeys) -> VerifiedCertificate:
    """Check a certificate's signature against ``public_keys`` and its contents against the
    schema; raise :class:`~kcert.attest.errors.VerificationError` when it must not be trusted.

    A valid signature over a failed verdict verifies: check ``.verdict`` as well.
    """
    # authenticate before interpreting: a file is parsed as an envelope only, then verified
    if isinstance(certificate, Envelope):
        envelope = certificate
    else:
        envelope = load_envelope(Path(certificate))
    return verify_envelope(envelope, _trusted(public_keys))


def inspect(certificate: CertificateLike) -> CertificateContents:
    """What a certificate says, *without* checking who signed it (for display and diff)."""
    if isinstance(certificate, CertificateContents):
        return certificate
    return inspect_envelope(_envelope(certificate))


def diff(a: CertificateLike, b: CertificateLike,
         thresholds: Thresholds | None = None) -> CertificateDiff:  # fmt: skip
    """What changed from certificate ``a`` to ``b``; ``.regressed`` says whether it got worse."""
    return diff_certificates(inspect(a), inspect(b), thresholds)


def open_registry(url: str | None = None, *, token: str | None = None,
                  home: Path | str | None = None) -> Registry:  # fmt: skip
    """A registry client: the server at ``url`` (bearer ``token``), or the embedded one.

    With neither ``url`` nor ``home`` it is the one the CLI would use: ``KCERT_REGISTRY``
    and ``KCERT_TOKEN``, else the embedded registry in ``KCERT_HOME``
    (``KCERT_DATABASE_URL`` picks its database). ``home`` names an embedded one's folder.
    Call ``close()`` when done (``contextlib.closing`` does it for you).
    """
    # lazy: `import kcert` stays cheap (PEP 562); the registry loads on first use
    from kcert.registry.client import EmbeddedRegistry, RemoteRegistry
    from kcert.registry.client import open_registry as open_configured
    from kcert.registry.config import Settings

    if url is not None:
        return RemoteRegistry(url, token=token)
    if home is not None:
        return EmbeddedRegistry(Settings(home=Path(home)))
    settings = Settings()
    if token is not None and settings.registry:
        return RemoteRegistry(settings.registry, token=token)
    return open_configured(settings)


def trust_key(registry: Registry, public_key: Ed25519PublicKey, *,
              name: str) -> TrustedKeyPublic:  # fmt: skip
    """Trust ``public_key`` (as ``name``) to sign the certificates ``registry`` accepts."""
    # lazy: `import kcert` stays cheap (PEP 562); the registry loads on first use
    from kcert.attest.keys import public_key_hex
    from kcert.registry.models import TrustedKeyCreate

    return registry.trust_key(TrustedKeyCreate(name=name, public_key=public_key_hex(public_key)))


def _envelope(certificate: CertificateLike) -> Envelope:
    if isinstance(certificate, CertificateContents):
        return certificate.envelope
    if isinstance(certificate, Envelope):
        return certificate
    return read_certificate(Path(certificate))


def _trusted(keys: PublicKeys) -> dict[str, Ed25519PublicKey]:
    if isinstance(keys, Ed25519PublicKey):
        return trust_map([keys])
    if isinstance(keys, Mapping):
        # the ids are recomputed from the keys: a mislabelled id must not name another key
        return trust_map(keys.values())
    return trust_map(keys)
