"""SARIF 2.1.0: kcert's findings where code-scanning tools show them, on the source.

One run, one rule per check. What the compiler or the lint points at (an NVRTC
error or warning, a Triton compile error, an interpreter hazard) is a result at
its file, line and column; every other failing check is a result at the line
that defines the kernel's entry, since it concerns the kernel as a whole. A
required check is an ``error``, one that is not required a ``warning``; a
kernel that stopped before a verdict is an ``error`` of the rule ``kcert``.
Files under the working folder are named relative to ``%SRCROOT%`` (what GitHub
code scanning expects), others by absolute ``file:`` URI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kcert import __version__
from kcert.certify.ci.locate import Location, build_findings, definition
from kcert.certify.ci.outcome import KernelOutcome
from kcert.certify.probe_checks import PROBE_CHECKS
from kcert.certify.report import CHECK_NAMES, Status

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"

#: What each rule catches (shown by code-scanning tools beside a result).
RULES: dict[str, str] = {
    "build": "The kernel compiles, its entry exists and its parameters match the spec's args.",
    "artifact": "Registers, spills, local and shared memory, required and forbidden PTX "
                "patterns are within the spec's limits.",
    "launch": "Every launch completes: no CUDA error, no crash, no hang.",
    **{check.name: check.summary for check in PROBE_CHECKS},
    "fresh-probes": "The kernel also passes probes drawn at certification time.",
    "timing": "The kernel's time against its baseline is physically possible.",
    "sanitizer": "compute-sanitizer tools find nothing.",
    "kcert": "kcert reached a verdict for the kernel (no usage or environment error).",
}  # fmt: skip


def render(outcomes: Sequence[KernelOutcome], *, command: str, base: Path) -> bytes:
    """The SARIF log for ``outcomes`` of ``kcert <command>``; paths relative to ``base``."""
    rule_ids = [*CHECK_NAMES, *(r for r in RULES if r not in CHECK_NAMES)]
    rule_index = {rule: i for i, rule in enumerate(rule_ids)}
    base = base.resolve()
    results: list[dict[str, Any]] = []
    for outcome in outcomes:
        for rule, level, text, location in _findings(outcome):
            results.append({
                "ruleId": rule,
                "ruleIndex": rule_index[rule],
                "level": level,
                "message": {"text": text},
                "locations": [_location(location, outcome, base)],
            })  # fmt: skip
    log = {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "kcert",
                "version": __version__,
                "rules": [{"id": rule, "name": rule,
                           "shortDescription": {"text": RULES.get(rule, rule)}}
                          for rule in rule_ids],
            }},
            "invocations": [{
                "commandLine": f"kcert {command}",
                "executionSuccessful": all(o.error is None for o in outcomes),
            }],
            "originalUriBaseIds": {"SRCROOT": {"uri": base.as_uri() + "/"}},
            "results": results,
        }],
    }  # fmt: skip
    return json.dumps(log, indent=2).encode() + b"\n"


def _findings(outcome: KernelOutcome) -> list[tuple[str, str, str, Location]]:
    kernel = outcome.kernel
    where = definition(kernel)
    prefix = f"kernel '{kernel.name}'"
    if outcome.error is not None:
        return [("kcert", "error", f"{prefix}: no verdict: {outcome.error}", where)]
    found: list[tuple[str, str, str, Location]] = []
    for check in outcome.checks:
        located = build_findings(kernel, check)
        for finding in located:
            found.append((check.name, finding.level, f"{prefix}: {finding.message}",
                          finding.location))  # fmt: skip
        if check.status is not Status.FAIL:
            continue
        level = "error" if check.required else "warning"
        if located and any(f.level == "error" for f in located):
            continue  # the compiler's own errors already say it, at their lines
        rule = check.name if check.name in RULES else "kcert"
        found.append((rule, level, f"{prefix}: {check.name} failed: {outcome.check_text(check)}",
                      where))  # fmt: skip
    return found


def _location(location: Location, outcome: KernelOutcome, base: Path) -> dict[str, Any]:
    path = location.path.resolve()
    if path.is_relative_to(base):
        artifact = {"uri": path.relative_to(base).as_posix(), "uriBaseId": "SRCROOT"}
    else:
        artifact = {"uri": path.as_uri()}
    region: dict[str, int] = {"startLine": location.line}
    if location.column is not None:
        region["startColumn"] = location.column
    return {
        "physicalLocation": {"artifactLocation": artifact, "region": region},
        "logicalLocations": [{"name": outcome.kernel.entry, "kind": "function"}],
    }
