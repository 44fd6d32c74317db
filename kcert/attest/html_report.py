"""A certificate as one self-contained HTML page (``kcert report CERT --html OUT``).

The page shows the verdict and every check, the environment, the timing, and
per probe where the error falls over each output (:mod:`kcert.attest.html_plots`).
It is one file with inline CSS and SVG and no script at all; its
Content-Security-Policy forbids every fetch, so nothing in it can reach the
network even if a browser were talked into trying.

A certificate is attacker-influenced (kernel names, check messages and probe
ids come from whoever wrote the kernel and spec), so every value is escaped
before it lands in the page, and the page says prominently when the signature
was not checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from kcert.attest.certificate import CertificateContents
from kcert.attest.html_plots import ProfileError, decode, legend, matrix_plot, vector_plot

#: Bins drawn per page. Each costs ~250 bytes of SVG for one character of certificate, and
#: the schema bounds a profile, not how many a certificate holds: without a page budget a
#: 3 MB certificate made a 490 MB page. Honest certificates stay far below (at most
#: 1024 bins per probe, and a few dozen probes).
MAX_DRAWN_BINS = 64 * 1024
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'"

_CSS = """
:root { --pass: #1a7f37; --fail: #c62828; --skip: #8a6d00; --ink: #1f2328; --mute: #59636e; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; background: #f6f8fa; }
main { max-width: 1100px; margin: 0 auto; padding: 20px 28px 40px; background: #fff; }
h1 { font-size: 22px; margin: 4px 0 2px; } h2 { font-size: 17px; margin: 26px 0 8px;
     border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { font-size: 14px; margin: 18px 0 6px; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace;
              font-size: 12.5px; overflow-wrap: anywhere; }
.verdict { display: inline-block; padding: 2px 12px; border-radius: 14px; color: #fff;
           font-weight: 700; letter-spacing: .04em; vertical-align: middle; margin-left: 8px; }
.verdict.pass { background: var(--pass); } .verdict.fail { background: var(--fail); }
.banner { margin: 12px 0; padding: 10px 14px; border-radius: 6px; font-weight: 600; }
.banner.unverified { background: #fff4d6; border: 2px solid #d4a72c; color: #6b4e00; }
.banner.verified { background: #e6f4ea; border: 1px solid #7dc890; color: #0f5323; }
table { border-collapse: collapse; width: 100%; margin: 4px 0 10px; }
th, td { text-align: left; vertical-align: top; padding: 4px 8px;
         border-bottom: 1px solid #eaeef2; }
th { background: #f6f8fa; font-weight: 600; white-space: nowrap; }
table.kv th { width: 210px; }
td.msg { white-space: pre-wrap; overflow-wrap: anywhere; }
.status { font-weight: 700; text-transform: uppercase; font-size: 12px; }
.status.pass { color: var(--pass); } .status.fail { color: var(--fail); }
.status.skip { color: var(--skip); }
details pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f8fa; padding: 6px;
              margin: 4px 0; font-size: 12px; }
.probe { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; margin: 12px 0; }
.probe.failing { border-color: var(--fail); }
.probe h3 { margin-top: 4px; } .mute { color: var(--mute); }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
.none { color: var(--mute); font-style: italic; margin: 6px 0; }
svg.plot { display: block; max-width: 100%; height: auto; margin: 4px 0 8px; }
svg .frame { fill: none; stroke: #57606a; stroke-width: 1; }
svg .grid { stroke: #d8dee4; stroke-width: 1; }
svg .bound { stroke: var(--fail); stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .ax { font-size: 11px; fill: #424a53; }
svg .bound-label { font-size: 11px; fill: var(--fail); font-weight: 600; }
svg .fail-mark { font-size: 10px; fill: var(--fail); font-weight: 700; }
svg .cell { stroke: #fff; stroke-width: .5; }
svg .cell-mark { font-size: 9px; fill: #5a0010; font-weight: 700; }
svg .cell-mark.on-dark { fill: #fff; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; font-size: 12px;
          margin: 6px 0 10px; }
.legend-title { font-weight: 600; }
.swatch i { display: inline-block; width: 14px; height: 14px; vertical-align: -3px;
            margin-right: 4px; border: 1px solid #aab2bb; }
"""

#: For the other self-contained pages (``kcert perf compare --html``): one look, one policy.
PAGE_CSP, PAGE_CSS = _CSP, _CSS


def render_html(contents: CertificateContents, *, keyid: str | None) -> str:
    """The page for a certificate; ``keyid`` names the key its signature verified against,
    None when it was not checked."""
    p = contents.predicate
    verdict = str(p["verdict"])
    kernel = p["kernel"]
    title = f"kcert report: {kernel['name']} ({verdict})"
    body = [
        f'<h1>{_e(kernel["name"])}<span class="verdict {_cls(verdict)}">{_e(verdict.upper())}'
        "</span></h1>",
        f'<div class="mono mute">certificate {_e(contents.id)}</div>',
        _signature(keyid),
        _kv("Kernel", [
            ("name", kernel["name"]), ("entry", kernel["entry"]), ("language", kernel["language"]),
            ("source", f"{kernel['source']} ({kernel['source_digest']})"),
            ("spec digest", kernel["spec_digest"]),
            ("hardware", f"{p['hardware']['class']} ({p['hardware']['executor']})"),
            ("issued at", p["issued_at"]),
            ("certifier", f"{p['certifier']['name']} {p['certifier']['version']}"),
        ]),  # fmt: skip
        _checks(p["checks"]),
        _notes(p.get("scope_notes", [])),
        _timing(p["timing"]),
        _environment(p["environment"]),
        _probes(p["probes"]["items"]),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body><main>\n"
        + "\n".join(part for part in body if part)
        + "\n</main></body></html>\n"
    )


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _cls(status: str) -> str:
    """A CSS class from a status the certificate names (only known ones get a colour)."""
    return status if status in ("pass", "fail", "skip") else "other"


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def _signature(keyid: str | None) -> str:
    if keyid is None:
        return ('<div class="banner unverified">\u26a0 Signature not verified. This page shows '
                "what the certificate says, not who signed it: run <code>kcert report CERT "
                "--key PUBLIC_KEY --html OUT</code> to check it.</div>")
    return f'<div class="banner verified">\u2714 Signature verified with key {_e(keyid)}.</div>'


def _kv(title: str, rows: Sequence[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td class=\"mono\">{_e(v)}</td></tr>" for k, v in rows)
    return f'<h2>{_e(title)}</h2><table class="kv">{cells}</table>'


def _checks(checks: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for c in checks:
        status = str(c["status"])
        details = c.get("details") or {}
        more = ("" if not details else "<details><summary>details</summary><pre>"
                f"{_e(json.dumps(details, indent=1, sort_keys=True))}</pre></details>")
        required = "" if c.get("required", True) else ' <span class="mute">(not required)</span>'
        rows.append(f'<tr><td>{_e(c["name"])}{required}</td><td class="status {_cls(status)}">'
                    f'{_e(status)}</td><td class="mono">{_e(c.get("probe") or "")}</td>'
                    f'<td class="msg">{_e(c["message"])}{more}</td></tr>')
    return ("<h2>Checks</h2><table><tr><th>check</th><th>status</th><th>probe</th>"
            f"<th>message</th></tr>{''.join(rows)}</table>")


def _notes(notes: Sequence[Mapping[str, Any]]) -> str:
    if not notes:
        return ""
    items = "".join(f"<li><b>{_e(n['kind'])}</b>: {_e(n['message'])}</li>" for n in notes)
    return f"<h2>What the probes could not show</h2><ul>{items}</ul>"


def _timing(t: Mapping[str, Any]) -> str:
    def median(result: Mapping[str, Any] | None) -> str:
        if not result:
            return "-"
        return f"{_num(result['median_ms'])} ms (p99 {_num(result['p99_ms'])})"

    rows = [("method", t["method"]), ("kernel", median(t.get("kernel"))),
            ("baseline", median(t.get("baseline"))), ("speedup", _num(t.get("speedup")))]
    if t.get("skipped_reason"):
        rows.append(("skipped", t["skipped_reason"]))
    return _kv("Timing", rows)


def _environment(env: Mapping[str, Any]) -> str:
    fields = env["fields"]
    rows = [(k, "-" if fields[k] is None else fields[k]) for k in sorted(fields)]
    return _kv("Environment", [("fingerprint", env["fingerprint"]), *rows])


def _probes(items: Sequence[Mapping[str, Any]]) -> str:
    parts = ["<h2>Probes: where the error falls</h2>", _overview(items), legend(),
             '<p class="mute">Each bar or cell is a bin of consecutive elements and shows the '
             "largest |got \u2212 reference| / allowed among them, on a log scale; above 1 (the "
             "dashed bound; red, \u2715) fails. Grey slivers are exact bins. Hover a bar or cell "
             "for its elements.</p>"]
    budget = [MAX_DRAWN_BINS]
    for number, probe in enumerate(items):
        parts.append(_probe(number, probe, budget))
    return "".join(parts)


def _overview(items: Sequence[Mapping[str, Any]]) -> str:
    """One line per probe, linking to its plots: with forty probes, where to look first."""
    rows = []
    for number, probe in enumerate(items):
        metrics: Mapping[str, Mapping[str, Any]] = probe["metrics"]
        bad = sum(int(m["bad_count"]) for m in metrics.values())
        worst = ", ".join(f"{output}: {_num(m['max_ulp'])} ulp" for output, m in metrics.items())
        rows.append(f'<tr><td class="mono"><a href="#probe-{number}">{_e(probe["id"])}</a></td>'
                    f'<td>{_e(probe["kind"])}</td><td class="status {"fail" if bad else "pass"}">'
                    f"{bad}</td><td>{_e(worst)}</td></tr>")
    return ("<table><tr><th>probe</th><th>kind</th><th>elements outside tolerance</th>"
            f"<th>max error</th></tr>{''.join(rows)}</table>")


def _probe(number: int, probe: Mapping[str, Any], budget: list[int]) -> str:
    metrics: Mapping[str, Mapping[str, Any]] = probe["metrics"]
    failing = any(m["bad_count"] for m in metrics.values())
    dims = ", ".join(f"{k}={v}" for k, v in probe["dims"].items())
    head = (f'<div class="probe{" failing" if failing else ""}" id="probe-{number}">'
            f'<h3>probe {_e(probe["id"])} '
            f'<span class="mute">({_e(probe["kind"])}, seed {_e(probe["seed"])}; {_e(dims)})'
            "</span></h3>")
    rows, plots = [], []
    for output, m in metrics.items():
        first = m["first_bad_index"]
        rows.append(
            f'<tr><td class="mono">{_e(output)}</td><td>{_e(_num(m["max_abs"]))}</td>'
            f'<td>{_e(_num(m["max_rel"]))}</td><td>{_e(_num(m["max_ulp"]))}</td>'
            f'<td class="status {"fail" if m["bad_count"] else "pass"}">{_e(m["bad_count"])}</td>'
            f'<td class="mono">{_e("-" if first is None else tuple(first))}</td>'
            f'<td>{_e(_num(m["atol"]))} + {_e(_num(m["rtol"]))}\u00b7|ref|</td></tr>')
        plots.append(_plot(str(probe["id"]), str(output), m.get("profile"), budget))
    table = ("<table><tr><th>output</th><th>max abs</th><th>max rel</th><th>max ulp</th>"
             "<th>bad</th><th>first bad index</th><th>tolerance</th></tr>"
             f"{''.join(rows)}</table>")
    return head + table + "".join(plots) + "</div>"


def _plot(probe_id: str, output: str, profile: Mapping[str, Any] | None,
          budget: list[int]) -> str:  # fmt: skip
    """One output's plot; ``budget`` holds the bins the page may still draw (spent here)."""
    label = f"<div><b>{_e(output)}</b>"
    if profile is None:
        return f'{label} <span class="none">no profile recorded</span></div>'
    try:
        extent, bins, levels = decode(profile)
    except ProfileError as exc:
        return f'{label} <span class="none">profile unreadable: {_e(exc)}</span></div>'
    if len(levels) > budget[0]:
        return (f'{label} <span class="none">not drawn: the page already shows '
                f"{MAX_DRAWN_BINS} bins</span></div>")
    budget[0] -= len(levels)
    title = f"probe {probe_id}, output {output}"
    shape = "\u00d7".join(str(v) for v in extent)
    draw = vector_plot if len(extent) == 1 else matrix_plot
    return f'{label} <span class="mute">({_e(shape)})</span></div>' + draw(
        extent, bins, levels, title)
