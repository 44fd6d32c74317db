"""The registry's state as its audit log tells it: every leaf folded in order.

Each state change is a leaf (:mod:`kcert.registry.audit`), so folding the
leaves from the first gives the state the log explains: trusted and revoked
keys, certificates (signer, subjects, verdict, hardware, fingerprint, sandbox,
revocation), targets (hardware, fingerprint, drift fields, generation), stale
marks and promotions. Nothing here reads a database or a clock.

A decision leaf records the inputs it was decided from. :func:`replay_history`
holds those inputs against the state folded from the leaves before it: a
promotion decided on a certificate whose ``certificate.revoked`` leaf comes
earlier is named, although its recorded inputs alone re-decide the same way
(``kcert audit replay N``). Candidates are compared as a set by id: their
order is storage time, which the log's order follows but does not prove. A
target with its own drift fields fingerprints a certificate over its recorded
environment, which only the certificate holds: a ``FingerprintOf`` callback
supplies it; when it cannot tell (no envelope to read), the recorded
fingerprint is taken as it is and the decision is listed as *unverified*: its
inputs were taken on the leaf's word, not checked.

At the end, every promotion the log leaves active must still have a valid
certificate by the folded state, under the policy that granted it: a change
(a revocation, a drift) logged without the suspension it called for is named
at the entry that granted the promotion. A promotion whose certificates
cannot be fingerprinted for its target is not checked there: it is listed as
unverified.

Tokens are folded from their ``token.created`` and ``token.revoked`` leaves
(id, scopes, expiry, revoked). A runtime mismatch (``observation.mismatch``)
must record the target's policy (``target.policy`` leaves) and the promotion's
status as the log has them, and an action that follows from them; a
suspension it records suspends the folded promotion. A promotion decision's
latency half (``kcert-promotion/3``) is taken from the leaf: the samples are
not in the log. Leaves of kinds this module does not know change nothing here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kcert.attest.certificate import inspect_envelope, parse_envelope
from kcert.digest import canonical_json
from kcert.errors import KcertError
from kcert.log.leaf import Leaf, LeafError, parse_leaf
from kcert.registry import audit
from kcert.registry.environment import fingerprint_over
from kcert.registry.policy import POLICY_VERSION, Candidate, PromotionInputs, decide_promotion
from kcert.registry.runtime_policy import MismatchInputs, decide_mismatch

#: A certificate's fingerprint over a target's drift fields, or ``None`` when unknown.
FingerprintOf = Callable[[str, Sequence[str]], "str | None"]


def envelope_fingerprints(read: Callable[[str], bytes | None]) -> FingerprintOf:
    """A ``FingerprintOf`` over signed envelopes: ``read(cid)`` gives the envelope's bytes
    (or None). An envelope that does not parse, or whose id is not ``cid``, gives None.
    Cached by certificate only: drift fields come as a list, which cannot be a key."""
    @functools.lru_cache(maxsize=4096)
    def environment(cid: str) -> tuple[str, dict[str, Any]] | None:
        data = read(cid)
        if data is None:
            return None
        try:
            contents = inspect_envelope(parse_envelope(data))
        except KcertError:
            return None
        if str(contents.id) != cid:
            return None
        fields = contents.predicate.get("environment", {}).get("fields", {})
        return str(contents.fingerprint), dict(fields)

    def fingerprint_of(cid: str, drift_fields: Sequence[str]) -> str | None:
        found = environment(cid)
        return None if found is None else fingerprint_over(found[0], found[1], drift_fields)

    return fingerprint_of

DECISIONS = (audit.PROMOTION_GRANTED, audit.PROMOTION_DENIED, audit.PROMOTION_SUSPENDED)


@dataclass(slots=True)
class LoggedKey:
    name: str
    public_key: str
    revoked: bool = False


@dataclass(slots=True)
class LoggedCertificate:
    keyid: str
    subjects: tuple[str, ...]
    verdict: str
    hw_class: str
    fingerprint: str
    sandboxed: bool | None
    #: Position among stored certificates (the log's order).
    order: int
    revoked: bool = False


@dataclass(slots=True)
class LoggedTarget:
    hw_class: str
    fingerprint: str
    drift_fields: list[str] | None
    generation: int


@dataclass(slots=True)
class LoggedToken:
    scopes: tuple[str, ...]
    expires_at: str | None
    revoked: bool = False


@dataclass(slots=True)
class LoggedPromotion:
    status: str  # "active" | "suspended"
    certificate: str | None
    #: The entry that granted it (last), and the policy it was granted under.
    granted_at: int = -1
    policy_version: str = POLICY_VERSION


@dataclass(frozen=True, slots=True)
class HistoryDifference:
    """A leaf that does not follow from the leaves before it."""

    index: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"entry {self.index} ({self.kind}): {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "message": self.message}


@dataclass(slots=True)
class LoggedState:
    """The registry's state after some prefix of its log."""

    keys: dict[str, LoggedKey] = field(default_factory=dict)
    certificates: dict[str, LoggedCertificate] = field(default_factory=dict)
    targets: dict[str, LoggedTarget] = field(default_factory=dict)
    #: (certificate, target, generation) of every ``certificate.invalidated`` leaf.
    stale: set[tuple[str, str, int]] = field(default_factory=set)
    #: (kernel, target) to the promotion's state.
    promotions: dict[tuple[str, str], LoggedPromotion] = field(default_factory=dict)
    #: API tokens by id (never their secrets: the log holds none).
    tokens: dict[str, LoggedToken] = field(default_factory=dict)
    #: Target to what a confirmed runtime mismatch does there (``target.policy`` leaves).
    on_mismatch: dict[str, str] = field(default_factory=dict)
    #: Certificate ids from before migration 0004 to the id the certificate has now.
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: What the last folded leaf took on its own word (cleared before each leaf).
    on_trust: list[str] = field(default_factory=list)

    def canonical(self, certificate: str) -> str:
        """The id a certificate has now (entries before migration 0004 name old ids)."""
        return self.aliases.get(certificate, certificate)

    def inputs(
        self, kernel: str, target: str, *, policy_version: str, order: Sequence[str] = (),
        fingerprint_of: FingerprintOf | None = None,
        recorded: Mapping[str, Candidate] | None = None,
    ) -> PromotionInputs:  # fmt: skip
        """What a decision on (kernel, target) should have seen, by this state.

        Candidates named in ``order`` come in that order, the rest newest first.
        ``recorded`` holds the candidates a decision recorded, by id: what the log
        cannot tell is taken from them (a fingerprint over a target's own drift
        fields when ``fingerprint_of`` cannot tell; the sandbox of a certificate
        stored before the registry logged it).
        """
        recorded = recorded or {}
        state = self.targets.get(target)
        drift = state.drift_fields if state is not None else None
        mine = [(cid, c) for cid, c in self.certificates.items() if kernel in c.subjects]
        rank = {cid: i for i, cid in enumerate(order)}
        mine.sort(key=lambda item: (rank.get(item[0], len(rank)), -item[1].order))
        candidates = []
        for cid, cert in mine:
            said = recorded.get(cid)
            fingerprint = cert.fingerprint
            if drift:
                known = fingerprint_of(cid, drift) if fingerprint_of is not None else None
                if known is None:
                    self.on_trust.append(
                        f"certificate {cid}'s fingerprint over the drift fields "
                        f"{list(drift)} was taken from the entry: its envelope could not be read"
                    )
                fingerprint = known or (said.fingerprint if said else fingerprint)
            sandboxed = cert.sandboxed
            if sandboxed is None and said is not None:
                sandboxed = said.sandboxed
            if policy_version == "kcert-promotion/1":
                sandboxed = None
            candidates.append(
                Candidate(id=cid, keyid=cert.keyid, verdict=cert.verdict, hw_class=cert.hw_class,
                          fingerprint=fingerprint, sandboxed=sandboxed)
            )  # fmt: skip
        return PromotionInputs(
            kernel=kernel,
            target=target,
            target_hw_class=state.hw_class if state is not None else None,
            target_fingerprint=state.fingerprint if state is not None else None,
            trusted_keys=tuple(sorted(k for k, v in self.keys.items() if not v.revoked)),
            revoked_keys=tuple(sorted({c.keyid for c in candidates if self._key_revoked(c.keyid)})),
            revoked_certificates=tuple(
                sorted(c.id for c in candidates if self.certificates[c.id].revoked)
            ),
            candidates=tuple(candidates),
            policy_version=policy_version,
        )

    def _key_revoked(self, keyid: str) -> bool:
        key = self.keys.get(keyid)
        return key is not None and key.revoked


@dataclass(frozen=True, slots=True)
class HistoryReplay:
    """The state the whole log folds to, and every leaf that does not follow from its past."""

    state: LoggedState
    #: How many decision leaves were replayed.
    decisions: int
    differences: list[HistoryDifference]
    #: What could not be checked (inputs taken on a leaf's word), by entry.
    unverified: list[HistoryDifference] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differences


def replay_history(
    entries: Iterable[tuple[int, bytes]], *, fingerprint_of: FingerprintOf | None = None,
    aliases: Mapping[str, str] | None = None,
) -> HistoryReplay:  # fmt: skip
    """Fold every leaf in order; re-derive each decision's inputs from the leaves before it.

    ``aliases`` maps certificate ids from before migration 0004 to the ids they
    have now (the registry's ``certificate_alias``); every id a leaf names is
    read through it, so the rows that migration merged fold into one.
    """
    state = LoggedState(aliases=dict(aliases or {}))
    differences: list[HistoryDifference] = []
    unverified: list[HistoryDifference] = []
    decisions = 0
    expected = 0
    for index, data in entries:
        if index != expected:
            raise LeafError(f"entry {expected} is missing: the history needs every leaf in order")
        expected += 1
        leaf = parse_leaf(index, data)
        state.on_trust.clear()
        found = apply(state, leaf, fingerprint_of=fingerprint_of)
        decisions += leaf.kind in DECISIONS
        differences.extend(HistoryDifference(index, leaf.kind, m) for m in found)
        unverified.extend(
            HistoryDifference(index, leaf.kind, m) for m in dict.fromkeys(state.on_trust)
        )
    state.on_trust.clear()
    for difference in _active_without_a_valid_certificate(state, fingerprint_of):
        (unverified if difference.unverified else differences).append(difference.value)
    return HistoryReplay(state, decisions, differences, unverified)


@dataclass(frozen=True, slots=True)
class _EndCheck:
    value: HistoryDifference
    unverified: bool


def _active_without_a_valid_certificate(
    state: LoggedState, fingerprint_of: FingerprintOf | None
) -> Iterator[_EndCheck]:
    """Promotions the log leaves active although, by the log, no certificate is valid for
    them any more under the policy that granted them: a change that should have
    suspended them was logged without the suspension. Those that cannot be checked
    (a certificate that cannot be fingerprinted) are yielded as unverified."""
    for (kernel, target), promotion in sorted(state.promotions.items()):
        if promotion.status != "active":
            continue
        if not _fingerprints_known(state, kernel, target, fingerprint_of):
            yield _EndCheck(
                HistoryDifference(
                    promotion.granted_at,
                    audit.PROMOTION_GRANTED,
                    f"promotion of {kernel} on {target!r} is active at the end of the log; "
                    "whether a certificate still holds for it is not checked: a candidate's "
                    "envelope could not be read to fingerprint it over the target's drift fields",
                ),  # fmt: skip
                unverified=True,
            )
            continue
        inputs = state.inputs(kernel, target, policy_version=promotion.policy_version,
                              fingerprint_of=fingerprint_of)  # fmt: skip
        decision = decide_promotion(inputs)
        if not decision.allow:
            yield _EndCheck(
                HistoryDifference(
                    promotion.granted_at,
                    audit.PROMOTION_GRANTED,
                    f"promotion of {kernel} on {target!r} is still active at the end of the "
                    f"log, which leaves it no valid certificate: {'; '.join(decision.reasons)}",
                ),  # fmt: skip
                unverified=False,
            )


def apply(
    state: LoggedState, leaf: Leaf, *, fingerprint_of: FingerprintOf | None = None
) -> list[str]:
    """Fold one leaf into ``state``; what about it does not follow from ``state`` before it."""
    p = leaf.payload
    try:
        if leaf.kind in DECISIONS:
            return _decision(state, leaf, fingerprint_of)
        handler = _HANDLERS.get(leaf.kind)
        return handler(state, p) if handler is not None else []
    except (KeyError, TypeError, ValueError) as exc:
        return [f"payload cannot be folded: {exc!r}"]
    except KcertError as exc:  # recorded inputs that contradict themselves
        return [f"payload cannot be folded: {exc.diagnostics()}"]


def _key_trusted(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    state.keys[str(p["keyid"])] = LoggedKey(str(p.get("name", "")), str(p["public_key"]))
    return []


def _key_revoked(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    key = state.keys.get(str(p["keyid"]))
    if key is None:
        return [f"revokes key {p['keyid']}, which no earlier entry trusted"]
    key.revoked = True
    return []


def _stored(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    named = str(p["certificate"])
    cid = state.canonical(named)
    if cid in state.certificates:
        # Rows of one statement under several old ids are one certificate since 0004,
        # with the first row's signer (its revocation is folded from its own leaf).
        return [] if named != cid else [f"stores certificate {cid} again"]
    sandboxed = p.get("sandboxed")
    state.certificates[cid] = LoggedCertificate(
        keyid=str(p["keyid"]), subjects=tuple(str(s) for s in p["subjects"]),
        verdict=str(p["verdict"]), hw_class=str(p["hw_class"]),
        fingerprint=str(p["fingerprint"]),
        sandboxed=sandboxed if isinstance(sandboxed, bool) else None,
        order=len(state.certificates),
    )  # fmt: skip
    return []


def _certificate(state: LoggedState, p: Mapping[str, Any]) -> LoggedCertificate | None:
    return state.certificates.get(state.canonical(str(p["certificate"])))


def _signer_changed(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    cert = _certificate(state, p)
    if cert is None:
        return [f"names certificate {p['certificate']}, which no earlier entry stored"]
    cert.keyid = str(p["keyid"])
    return []


def _revoked(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    cert = _certificate(state, p)
    if cert is None:
        return [f"revokes certificate {p['certificate']}, which no earlier entry stored"]
    cert.revoked = True
    return []


def _invalidated(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    cid = state.canonical(str(p["certificate"]))
    state.stale.add((cid, str(p["target"]), int(p["generation"])))
    return []


def _token_created(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    token = str(p["token_id"])
    if token in state.tokens:
        return [f"creates token {token} again"]
    expires = p.get("expires_at")
    state.tokens[token] = LoggedToken(
        scopes=tuple(sorted(str(s) for s in p["scopes"])),
        expires_at=None if expires is None else str(expires),
    )
    return []


def _token_revoked(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    token = state.tokens.get(str(p["token_id"]))
    if token is None:
        return [f"revokes token {p['token_id']}, which no earlier entry created"]
    token.revoked = True
    return []


def _reported(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    fields = p.get("drift_fields")
    state.targets[str(p["target"])] = LoggedTarget(
        hw_class=str(p["hw_class"]), fingerprint=str(p["fingerprint"]),
        drift_fields=[str(f) for f in fields] if fields else None,
        generation=int(p["generation"]),
    )  # fmt: skip
    return []


def _policy(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    target = str(p["target"])
    if target not in state.targets:
        return [f"sets the policy of target {target!r}, which no earlier entry reported"]
    state.on_mismatch[target] = str(p["on_mismatch"])
    return []


def _mismatch(state: LoggedState, p: Mapping[str, Any]) -> list[str]:
    """A runtime mismatch: its recorded inputs must be the log's own state, and its action
    must follow from them; a suspension suspends the folded promotion."""
    recorded = MismatchInputs.from_json(p["inputs"])
    key = (recorded.kernel, recorded.target)
    promotion = state.promotions.get(key)
    found: list[str] = []
    want = {
        "on_mismatch": state.on_mismatch.get(recorded.target, "record"),
        "promotion": promotion.status if promotion is not None else None,
    }
    for name, value in want.items():
        said = getattr(recorded, name)
        if said != value:
            found.append(f"{name}: recorded {said!r}, the log's history gives {value!r}")
    decision = p["decision"]
    replayed = decide_mismatch(recorded)
    if bool(decision.get("suspend")) != replayed.suspend:
        found.append(f"decision: recorded suspend={decision.get('suspend')!r}, "
                     f"replayed suspend={replayed.suspend!r}")  # fmt: skip
    if decision.get("suspend") and promotion is not None:
        promotion.status = "suspended"
    return found


_HANDLERS: dict[str, Callable[[LoggedState, Mapping[str, Any]], list[str]]] = {
    audit.TARGET_POLICY: _policy,
    audit.OBSERVATION_MISMATCH: _mismatch,
    audit.KEY_TRUSTED: _key_trusted,
    audit.KEY_REVOKED: _key_revoked,
    audit.CERTIFICATE_STORED: _stored,
    audit.CERTIFICATE_COSIGNED: _signer_changed,
    audit.CERTIFICATE_RESIGNED: _signer_changed,
    audit.CERTIFICATE_REVOKED: _revoked,
    audit.CERTIFICATE_INVALIDATED: _invalidated,
    audit.FINGERPRINT_REPORTED: _reported,
    audit.TOKEN_CREATED: _token_created,
    audit.TOKEN_REVOKED: _token_revoked,
}


def _decision(state: LoggedState, leaf: Leaf, fingerprint_of: FingerprintOf | None) -> list[str]:
    recorded = _through_aliases(state, PromotionInputs.from_json(leaf.payload["inputs"]))
    decision = dict(leaf.payload["decision"])
    if decision.get("certificate") is not None:
        decision["certificate"] = state.canonical(str(decision["certificate"]))
    order = [c.id for c in recorded.candidates]
    folded = state.inputs(
        recorded.kernel, recorded.target, policy_version=recorded.policy_version, order=order,
        fingerprint_of=fingerprint_of, recorded={c.id: c for c in recorded.candidates},
    )  # fmt: skip
    # Latency samples are not in the log: the recorded latency half is taken as it is.
    folded = replace(folded, latency=recorded.latency)
    found = _compare_inputs(recorded, folded)
    try:
        replayed = decide_promotion(folded)
    except KcertError as exc:
        return [*found, f"cannot be decided again: {exc.diagnostics()}"]
    logged = _verdict(decision.get("allow"), decision.get("certificate"))
    if logged != _verdict(replayed.allow, replayed.certificate):
        found.append(
            f"decision: recorded {logged}, "
            f"the log's history gives {_verdict(replayed.allow, replayed.certificate)}"
        )
    key = (recorded.kernel, recorded.target)
    if leaf.kind == audit.PROMOTION_GRANTED and decision.get("allow"):
        state.promotions[key] = LoggedPromotion(
            "active", decision.get("certificate"), leaf.index, recorded.policy_version
        )
    elif leaf.kind == audit.PROMOTION_SUSPENDED:
        promotion = state.promotions.get(key)
        if promotion is None or promotion.status != "active":
            found.append(f"suspends {recorded.kernel} on {recorded.target!r}, which was not active")
        if promotion is not None:
            promotion.status = "suspended"
    return found


def _through_aliases(state: LoggedState, inputs: PromotionInputs) -> PromotionInputs:
    """``inputs`` with every certificate id read through the aliases (one candidate per id)."""
    if not state.aliases:
        return inputs
    candidates: dict[str, Candidate] = {}
    for c in inputs.candidates:
        cid = state.canonical(c.id)
        candidates.setdefault(cid, replace(c, id=cid))
    revoked = sorted({state.canonical(c) for c in inputs.revoked_certificates})
    return replace(inputs, candidates=tuple(candidates.values()),
                   revoked_certificates=tuple(revoked))  # fmt: skip


def _fingerprints_known(
    state: LoggedState, kernel: str, target: str, fingerprint_of: FingerprintOf | None
) -> bool:
    """Whether the kernel's certificates can be fingerprinted as ``target`` needs."""
    logged = state.targets.get(target)
    if logged is None or not logged.drift_fields:
        return True
    drift = logged.drift_fields
    return fingerprint_of is not None and all(
        fingerprint_of(cid, drift) is not None
        for cid, cert in state.certificates.items()
        if kernel in cert.subjects
    )


def _verdict(allow: Any, certificate: Any) -> str:
    return f"allow ({certificate})" if allow else "deny"


def _compare_inputs(recorded: PromotionInputs, folded: PromotionInputs) -> list[str]:
    found: list[str] = []
    mine, theirs = recorded.to_json(), folded.to_json()
    for name in ("target_hw_class", "target_fingerprint", "trusted_keys", "revoked_keys",
                 "revoked_certificates"):  # fmt: skip
        if canonical_json(mine[name]) != canonical_json(theirs[name]):
            found.append(
                f"{name}: recorded {mine[name]!r}, the log's history gives {theirs[name]!r}"
            )
    have = {c["id"]: c for c in mine["candidates"]}
    want = {c["id"]: c for c in theirs["candidates"]}
    for cid in sorted(have.keys() - want.keys()):
        found.append(f"candidate {cid} is not a certificate of this kernel in the log's history")
    for cid in sorted(want.keys() - have.keys()):
        found.append(f"certificate {cid} of this kernel is missing from the recorded candidates")
    for cid in sorted(have.keys() & want.keys()):
        for name in sorted(set(have[cid]) | set(want[cid])):
            if have[cid].get(name) != want[cid].get(name):
                found.append(
                    f"candidate {cid} {name}: recorded {have[cid].get(name)!r}, "
                    f"the log's history gives {want[cid].get(name)!r}"
                )
    return found
