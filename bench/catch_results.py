"""The results of a catch-rate run: one record per variant, its tables, its JSON round trip.

``catch_rate.py`` makes a :class:`VariantResult` per original and mutant (kcert's
outcome and the oracle's), prints the per-kernel table and the totals against
issue 13's goals (:func:`print_table`), the per-variant lines
(:func:`print_details`), and saves them with ``--json``; ``--from-json`` reads
them back (:func:`load_results`) to print the tables again without running.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from catch_oracle import ORACLE_TOLERANCES, OracleOutcome, tol_key


@dataclass
class KcertOutcome:
    verdict: str  # "pass", "fail" or "refused" (the spec or the reference could not be used)
    failed: list[str] = field(default_factory=list)  # failing required checks
    message: str = ""  # the first failing check's message, or why it was refused
    wall_s: float = 0.0

    @property
    def caught(self) -> bool:
        return self.verdict != "pass"


@dataclass
class VariantResult:
    kernel: str
    variant: str  # "original" or the mutant's name
    bug_class: str
    description: str
    kcert: KcertOutcome
    oracle: OracleOutcome | None


# ---------------------------------------------------------------------------- the table


def _mark(caught: bool, original: bool) -> str:
    if original:
        return "FALSE ALARM" if caught else "pass"
    return "caught" if caught else "MISSED"


def print_details(results: list[VariantResult]) -> None:
    keys = [tol_key(t) for t in ORACLE_TOLERANCES]
    for r in results:
        original = r.variant == "original"
        line = f"  {r.kernel}/{r.variant}: kcert {_mark(r.kcert.caught, original)}"
        if r.kcert.failed:
            line += f" [{', '.join(r.kcert.failed)}]"
        line += f" ({r.kcert.wall_s:.1f} s)"
        if r.oracle is not None and r.oracle.ran:
            marks = ", ".join(f"{k} {_mark(r.oracle.mismatched[k], original)}" for k in keys)
            line += f"; oracle {marks} ({r.oracle.wall_s:.1f} s)"
        elif r.oracle is not None:
            line += "; oracle not run"
        print(line)
        if not original and r.description:
            print(f"      {r.bug_class}: {r.description}")
        if r.kcert.message and (original or r.kcert.caught):
            print(f"      kcert: {r.kcert.message[:300]}")
        if r.oracle is not None and r.oracle.message and original:
            print(f"      oracle: {r.oracle.message[:300]}")


def _measured(rows: list[VariantResult]) -> list[VariantResult]:
    """Mutants whose verdict says something about the bug: not refused like their original."""
    orig = next((r for r in rows if r.variant == "original"), None)
    refused = orig is not None and orig.kcert.verdict == "refused"
    return [r for r in rows if r.variant != "original"
            and not (refused and r.kcert.verdict == "refused")]  # fmt: skip


def print_table(results: list[VariantResult]) -> None:
    """One row per kernel; then the totals against the goals."""
    keys = [tol_key(t) for t in ORACLE_TOLERANCES]
    by_kernel: dict[str, list[VariantResult]] = {}
    for r in results:
        by_kernel.setdefault(r.kernel, []).append(r)
    with_oracle = any(r.oracle is not None for r in results)
    head = ["kernel", "original: kcert", "mutants", "kcert caught"]
    if with_oracle:
        head += [f"oracle {k}: original / caught" for k in keys]
    head += ["kcert s"] + (["oracle s"] if with_oracle else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    fa = orig_n = mut_n = caught_n = clean_n = clean_caught = 0
    unmeasured = 0
    kt_all = kt_both = ot_all = 0.0
    o_fa = dict.fromkeys(keys, 0)
    o_caught = dict.fromkeys(keys, 0)
    o_n = o_orig = 0
    for name, rows in by_kernel.items():
        orig = next((r for r in rows if r.variant == "original"), None)
        muts = [r for r in rows if r.variant != "original"]
        measured = _measured(rows)
        status = "-"
        if orig is not None:
            status = "pass" if not orig.kcert.caught else (
                f"**{orig.kcert.verdict}** ({', '.join(orig.kcert.failed)})")  # fmt: skip
        caught = sum(r.kcert.caught for r in measured)
        cells = [name, status, str(len(muts)),
                 f"{caught} of {len(measured)}" if measured else "not measured"]  # fmt: skip
        ran = [r for r in muts if r.oracle is not None and r.oracle.ran]
        if with_oracle:
            orig_ran = orig is not None and orig.oracle is not None and orig.oracle.ran
            for k in keys:
                if not orig_ran and not ran:
                    cells.append("not run")
                    continue
                first = "-"
                if orig is not None and orig.oracle is not None and orig_ran:
                    first = "**false alarm**" if orig.oracle.mismatched[k] else "pass"
                    o_fa[k] += orig.oracle.mismatched[k]
                got = sum(r.oracle.mismatched[k] for r in ran if r.oracle is not None)
                o_caught[k] += got
                cells.append(f"{first} / {got} of {len(ran)}")
            o_n += len(ran)
            o_orig += orig_ran
        kt = sum(r.kcert.wall_s for r in rows)
        ot = sum(r.oracle.wall_s for r in rows if r.oracle is not None and r.oracle.ran)
        cells.append(f"{kt:.0f}")
        if with_oracle:
            cells.append(f"{ot:.0f}" if ot else "-")
        print("| " + " | ".join(cells) + " |")
        orig_n += orig is not None
        fa += bool(orig is not None and orig.kcert.caught)
        mut_n += len(measured)
        unmeasured += len(muts) - len(measured)
        caught_n += caught
        if orig is not None and not orig.kcert.caught:
            clean_n += len(measured)
            clean_caught += caught
        kt_all += kt
        kt_both += sum(r.kcert.wall_s for r in rows if r.oracle is not None and r.oracle.ran)
        ot_all += ot
    print()
    share = f" ({caught_n / mut_n:.0%})" if mut_n else ""
    print(f"kcert: {fa} false alarm(s) on {orig_n} originals; {caught_n} of {mut_n} mutants "
          f"caught{share}" + (f"; {unmeasured} not measured (their spec is refused, as the "
                              f"original's)" if unmeasured else ""))  # fmt: skip
    if clean_n:
        print(f"kcert on the kernels whose original passes: {clean_caught} of {clean_n} mutants "
              f"caught ({clean_caught / clean_n:.0%})")  # fmt: skip
    if with_oracle:
        for k in keys:
            share = f" ({o_caught[k] / o_n:.0%})" if o_n else ""
            print(f"oracle at atol = rtol = {k}: {o_fa[k]} false alarm(s) on {o_orig} "
                  f"originals; {o_caught[k]} of {o_n} mutants caught{share}")  # fmt: skip
        if ot_all:
            print(f"wall time over the variants both ran: kcert {kt_both:.0f} s, oracle "
                  f"{ot_all:.0f} s, ratio {kt_both / ot_all:.1f}x (kcert over all: "
                  f"{kt_all:.0f} s)")  # fmt: skip


def load_results(path: Path) -> list[VariantResult]:
    """Results saved by ``--json``, to print their table again."""
    results = []
    for row in json.loads(path.read_text()):
        oracle = OracleOutcome(**row["oracle"]) if row["oracle"] is not None else None
        results.append(VariantResult(row["kernel"], row["variant"], row["bug_class"],
                                     row["description"], KcertOutcome(**row["kcert"]),
                                     oracle))  # fmt: skip
    return results


def summary(results: list[VariantResult]) -> Mapping[str, Any]:
    """Counts a test can assert on: false alarms and caught mutants per side."""
    originals = [r for r in results if r.variant == "original"]
    mutants = [r for r in results if r.variant != "original"]
    return {
        "false_alarms": [r.kernel for r in originals if r.kcert.caught],
        "missed": [f"{r.kernel}/{r.variant}" for r in mutants if not r.kcert.caught],
    }
