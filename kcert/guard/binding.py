"""A certified kernel as the guard sees it, and how a call maps onto its spec.

:class:`CertifiedKernel` joins a certificate to its spec and refuses a pair that
do not belong together: the spec's digest and its reference's digest must be
the ones the certificate names, or the guard would check production against a
reference nobody certified.

**Calling convention.** The guarded callable takes the kernel's
``[kernel.args]``: positional arguments in the spec's order, keyword arguments
by their spec names (other keywords, ``stream=`` say, pass through unseen).
Buffers are arrays (NumPy, torch or CuPy). Scalars and consts may be left out:
they then take the spec's values. The outputs are what the call returns when
it returns arrays (one array for a kernel with one output, a tuple in the
order of the outputs, or a dict by name); an output it does not return is read
from the ``out`` or ``inout`` buffer passed, after the call (a launcher that
writes in place and returns None). The dims are read from the buffers' extents
that are a bare dim name (``f32[m, n]``) and from scalars defined as one
(``n = "i32 = n"``). A callable with another signature is given an *adapter*,
a function of the same arguments that returns them by spec name
(``lambda x, out: {"x_ptr": x, "out_ptr": out}``).

**Scope.** A call is in the certified scope when every dim lies between the
smallest and the largest size probed (the predicate's ``probes.scope``), no
buffer is larger than the largest probed, its scalars and consts are the
spec's, and (for checked calls) every float input lies inside the magnitudes
its ``[kernel.values]`` domain was probed over (``probes.domain_ends``). Each
reason is a sentence, so a report says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kcert.attest.certificate import (
    CertificateContents,
    inspect_envelope,
    read_certificate,
    verify_envelope,
)
from kcert.attest.dsse import Envelope
from kcert.attest.keys import load_public_key, trust_map
from kcert.certify.errors import SpecError
from kcert.certify.probes import domain_ends
from kcert.certify.spec import (
    FLOAT_DTYPES,
    BufferArg,
    ConstArg,
    Intent,
    KernelSpec,
    Launch,
    ScalarArg,
    ValueDomain,
    load_spec,
)
from kcert.guard import arrays
from kcert.guard.errors import GuardError

#: Launches kept per kernel, by dims: binding the spec's expressions on every call is slow.
LAUNCH_CACHE = 256
#: Maps a guarded callable's own arguments to the spec's argument names.
Adapter = Callable[..., Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class BoundCall:
    """One call mapped onto the spec: its arguments by name, launch, and what is off-scope."""

    values: Mapping[str, Any]
    dims: Mapping[str, int]
    launch: Launch | None
    reasons: tuple[str, ...]


class CertifiedKernel:
    """A certificate and the spec it was made from, checked to belong together."""

    def __init__(self, contents: CertificateContents, kernel: KernelSpec) -> None:
        kid = contents.predicate.get("kernel", {})
        for key, mine in (("spec_digest", kernel.digest),
                          ("reference_digest", kernel.reference.code.digest)):  # fmt: skip
            if str(kid.get(key)) != str(mine):
                raise GuardError(
                    f"certificate {contents.id} names {key} {kid.get(key)}, but kernel "
                    f"'{kernel.name}' of {kernel.spec_path} has {mine}: give the spec (and "
                    "reference) the certificate was made from")
        if str(contents.verdict) != "pass":
            raise GuardError(f"certificate {contents.id} has verdict {contents.verdict}; "
                             "a guard vouches only for a passing kernel")
        self.contents = contents
        self.kernel = kernel
        probes = contents.predicate.get("probes", {})
        self.scope: dict[str, tuple[int, int]] = {}
        for name, values in kernel.dims.items():
            entry = probes.get("scope", {}).get(name, {})
            low, high = entry.get("min"), entry.get("max")
            # certificates made before the scope was recorded: the listed values
            self.scope[name] = (low if low is not None else min(values),
                                high if high is not None else max(values))  # fmt: skip
        largest = probes.get("largest_elements")
        self.largest_elements: int | None = int(largest) if largest is not None else None
        self._launches: dict[tuple[tuple[str, int], ...], Launch | str] = {}
        self._names = tuple(a.name for a in kernel.args)
        self._bound: dict[tuple[Any, ...], tuple[dict[str, int], Launch | None,
                                                 tuple[str, ...]]] = {}  # fmt: skip

    @classmethod
    def load(cls, certificate: str | Path | Envelope | CertificateContents,
             spec: str | Path | KernelSpec, *,
             key: str | Path | Ed25519PublicKey | None = None) -> CertifiedKernel:  # fmt: skip
        """Read a certificate and its spec; with ``key``, the signature must verify with it.

        Without a key the certificate is read, not authenticated: the guard only reports,
        and the registry verifies every certificate it is told about.
        """
        if isinstance(certificate, CertificateContents):
            envelope = certificate.envelope
        elif isinstance(certificate, Envelope):
            envelope = certificate
        else:
            envelope = read_certificate(Path(certificate))
        if key is not None:
            public = key if isinstance(key, Ed25519PublicKey) else load_public_key(Path(key))
            contents: CertificateContents = verify_envelope(envelope, trust_map([public]))
        else:
            contents = inspect_envelope(envelope)
        if isinstance(spec, KernelSpec):
            kernel = spec
        else:
            kernel = load_spec(Path(spec)).kernel(contents.kernel_name)
        return cls(contents, kernel)

    # ------------------------------------------------------------------ calls

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
             adapter: Adapter | None = None) -> BoundCall:  # fmt: skip
        """Map one call's arguments onto the spec and test its shapes against the scope.

        ``adapter`` maps a callable's own arguments to the spec's names, for a callable
        whose signature is not the kernel's. Calls alike in their shapes and scalars
        share one answer: traffic repeats a few shapes, and binding the spec's
        expressions is the slow part of a call.
        """
        if adapter is not None:
            values = {n: v for n, v in adapter(*args, **kwargs).items() if n in self._names}
        else:
            values = dict(zip(self._names, args, strict=False))
            if kwargs:
                values.update((n, kwargs[n]) for n in self._names if n in kwargs)
        key = tuple([v.shape if type(v) is np.ndarray else _key(v)
                     for v in map(values.get, self._names)])
        known = self._bound.get(key)
        if known is None:
            known = self._bind(values)
            if len(self._bound) >= LAUNCH_CACHE:
                self._bound.clear()
            self._bound[key] = known
        dims, launch, reasons = known
        return BoundCall(values, dims, launch, reasons)

    def _bind(self, values: Mapping[str, Any],
              ) -> tuple[dict[str, int], Launch | None, tuple[str, ...]]:  # fmt: skip
        spec_args = self.kernel.args
        reasons: list[str] = []
        dims: dict[str, int] = {}
        for arg in spec_args:
            value = values.get(arg.name)
            if isinstance(arg, BufferArg) and value is not None and arrays.kind(value):
                shape = arrays.shape(value)
                if len(shape) != len(arg.shape):
                    reasons.append(f"'{arg.name}' has {len(shape)} axes, the spec "
                                   f"{len(arg.shape)}")  # fmt: skip
                    continue
                for extent, size in zip(arg.shape, shape, strict=True):
                    _learn(dims, extent.text, size, self.kernel, reasons, arg.name)
            elif isinstance(arg, ScalarArg) and value is not None:
                if isinstance(value, int | np.integer):
                    _learn(dims, arg.value.text, int(value), self.kernel, reasons, arg.name)
        missing = sorted(set(self.kernel.dims) - set(dims))
        if missing:
            reasons.append(f"dim(s) {', '.join(missing)} cannot be read from the call")
            return dims, None, tuple(reasons)
        launch = self._launch(dims, reasons)
        if launch is not None:
            reasons.extend(self._shape_reasons(values, dims, launch))
            launch = _with_call_scalars(self.kernel, launch, values, reasons)
        return dims, launch, tuple(reasons)

    def _launch(self, dims: Mapping[str, int], reasons: list[str]) -> Launch | None:
        key = tuple(sorted(dims.items()))
        launch = self._launches.get(key)
        if launch is None:
            try:
                launch = self.kernel.bind(dims)
            except SpecError as exc:
                launch = f"the spec cannot be bound to dims {dict(dims)}: {exc.diagnostics()}"
            if len(self._launches) >= LAUNCH_CACHE:
                self._launches.clear()
            self._launches[key] = launch
        if isinstance(launch, str):
            reasons.append(launch)
            return None
        return launch

    def _shape_reasons(self, values: Mapping[str, Any], dims: Mapping[str, int],
                       launch: Launch) -> list[str]:  # fmt: skip
        reasons = []
        for name, size in dims.items():
            low, high = self.scope[name]
            if size < low:
                reasons.append(f"{name} = {size} is below the smallest size certified ({low})")
            elif size > high:
                reasons.append(f"{name} = {size} is above the largest size certified ({high})")
        for buf in self.kernel.buffers:
            value = values.get(buf.name)
            if value is None or not arrays.kind(value):
                continue
            shape = arrays.shape(value)
            if shape != launch.shapes[buf.name]:
                reasons.append(f"'{buf.name}' has shape {shape}, the spec gives "
                               f"{launch.shapes[buf.name]} for {dict(dims)}")  # fmt: skip
            elif self.largest_elements is not None and math.prod(shape) > self.largest_elements:
                reasons.append(f"'{buf.name}' holds {math.prod(shape)} elements, more than any "
                               f"buffer certified ({self.largest_elements})")  # fmt: skip
        return reasons

    def value_reasons(self, launch: Launch,
                      inputs: Mapping[str, np.ndarray[Any, Any]]) -> list[str]:  # fmt: skip
        """Why the float inputs lie outside the values the certificate probed (empty: inside)."""
        reasons = []
        for buf in self.kernel.buffers:
            if buf.intent is Intent.OUT or buf.dtype not in FLOAT_DTYPES or buf.name not in inputs:
                continue
            domain = launch.domains.get(buf.name) or self.kernel.values.get(buf.name)
            allowed = self.kernel.nonfinite.get(buf.name, ())
            reason = _outside(buf, domain or ValueDomain("auto"), inputs[buf.name], allowed)
            if reason:
                reasons.append(reason)
        return reasons


def _key(value: Any) -> Any:
    """What of an argument decides its binding: an array's shape, a scalar's value."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.shape
    if isinstance(value, bool | int | float | str):
        return (type(value).__name__, value)
    if isinstance(value, np.generic):
        return (type(value).__name__, value.item())
    if arrays.kind(value) is not None:
        return arrays.shape(value)
    return type(value).__name__


def _learn(dims: dict[str, int], text: str, size: int, kernel: KernelSpec,
           reasons: list[str], where: str) -> None:  # fmt: skip
    name = text.strip()
    if name not in kernel.dims:
        return
    if name in dims and dims[name] != size:
        reasons.append(f"'{where}' says {name} = {size}, an earlier argument {dims[name]}")
        return
    dims.setdefault(name, size)


def _with_call_scalars(kernel: KernelSpec, launch: Launch, values: Mapping[str, Any],
                       reasons: list[str]) -> Launch:  # fmt: skip
    """``launch`` with the call's own scalars and consts; each that differs is a reason."""
    scalars, consts = dict(launch.scalars), dict(launch.consts)
    for arg in kernel.args:
        given = values.get(arg.name)
        if given is None or not isinstance(arg, ScalarArg | ConstArg):
            continue
        table: dict[str, Any] = scalars if isinstance(arg, ScalarArg) else consts
        certified = table.get(arg.name)
        if isinstance(given, np.generic):
            given = given.item()
        if not isinstance(given, int | float | str) or given == certified:
            continue
        if (isinstance(arg, ScalarArg) and arg.dtype in FLOAT_DTYPES and certified is not None
                and np.float32(given) == np.float32(certified) and arg.dtype != "f64"):
            continue  # the same value once the kernel rounds it
        reasons.append(f"{arg.name} = {given!r}, the certificate's is {certified!r}")
        table[arg.name] = given
    if scalars == launch.scalars and consts == launch.consts:
        return launch
    return Launch(launch.dims, scalars, consts, launch.shapes, launch.grid, launch.block,
                  launch.shared_mem, launch.domains)  # fmt: skip


def _outside(buf: BufferArg, domain: ValueDomain, values: np.ndarray[Any, Any],
             allowed: Sequence[str]) -> str | None:  # fmt: skip
    with np.errstate(all="ignore"):
        wide = np.asarray(values).astype(np.float64).reshape(-1)
        finite = np.isfinite(wide)
        if not finite.all():
            kinds = {"nan": np.isnan(wide).any(), "inf": (wide == np.inf).any(),
                     "-inf": (wide == -np.inf).any()}  # fmt: skip
            extra = sorted(k for k, present in kinds.items() if present and k not in allowed)
            if extra:
                return f"'{buf.name}' holds {', '.join(extra)}, which its probes never did"
        good = wide[finite]
        if good.size == 0:
            return None
        if domain.kind == "uniform":
            low, high = float(good.min()), float(good.max())
            if low < domain.a or high > domain.b:
                return (f"'{buf.name}' holds values in [{low:.6g}, {high:.6g}], outside its "
                        f"domain {domain.spec_text()}")  # fmt: skip
            return None
        centre, tiny, large, _ = domain_ends(buf.dtype, domain)
        size = np.abs(good - centre)
        top = float(size.max())
        if top > large:
            return (f"'{buf.name}' reaches |x - {centre:g}| = {top:.6g}, beyond the {large:.6g} "
                    f"its probes reached ({domain.spec_text()})")  # fmt: skip
        nonzero = size[size > 0]
        if nonzero.size and float(nonzero.min()) < tiny:
            return (f"'{buf.name}' holds |x - {centre:g}| = {float(nonzero.min()):.3g}, below the "
                    f"{tiny:.3g} its probes reached ({domain.spec_text()})")  # fmt: skip
    return None
