"""JUnit XML: one ``<testsuite>`` per kernel, one ``<testcase>`` per check.

The layout is the one CI servers (GitLab, Jenkins, GitHub test-report actions)
read: a failed required check is a ``<failure>`` whose text is the check's
message, probe, smallest failing shape and compiler log; a skipped check is
``<skipped>`` with its reason; a kernel that stopped before a verdict (no GPU,
a sandbox missing) is one ``<error>`` case. A check that failed but is not
required passes, with its message in ``<system-out>``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from kcert.certify.ci.outcome import KernelOutcome
from kcert.certify.report import Status

#: Characters XML 1.0 cannot hold at all; a kernel's output or log may contain them.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)


def _shown(path: Path) -> str:
    """A path as CI shows it: relative to the working folder when it is inside it."""
    resolved, here = path.resolve(), Path.cwd().resolve()
    shown = resolved.relative_to(here).as_posix() if resolved.is_relative_to(here) else str(path)
    return _text(shown)  # a file name may hold any byte but "/" and NUL


def render(outcomes: Sequence[KernelOutcome], *, command: str) -> bytes:
    """The JUnit document for ``outcomes`` of ``kcert <command>``."""
    root = ET.Element("testsuites", name=f"kcert {command}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    for outcome in outcomes:
        suite = _suite(outcome, command)
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
        total_time += outcome.duration_s
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def _suite(outcome: KernelOutcome, command: str) -> ET.Element:
    kernel = outcome.kernel
    suite = ET.Element("testsuite", name=kernel.name, time=f"{outcome.duration_s:.3f}",
                       file=_shown(kernel.spec_path))  # fmt: skip
    classname = f"kcert.{command}.{kernel.name}"
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if outcome.error is not None:
        case = ET.SubElement(suite, "testcase", classname=classname, name=command)
        error = ET.SubElement(case, "error", type=outcome.error_kind or "error",
                              message=_text(outcome.error.splitlines()[0]))  # fmt: skip
        error.text = _text(outcome.error)
        counts["tests"], counts["errors"] = 1, 1
    for check in outcome.checks:
        case = ET.SubElement(suite, "testcase", classname=classname, name=check.name,
                             file=_shown(kernel.source))  # fmt: skip
        counts["tests"] += 1
        if check.status is Status.SKIP:
            ET.SubElement(case, "skipped", message=_text(check.message))
            counts["skipped"] += 1
        elif check.status is Status.FAIL and check.required:
            failure = ET.SubElement(case, "failure", type=check.name,
                                    message=_text(check.message))  # fmt: skip
            failure.text = _text(outcome.check_text(check))
            counts["failures"] += 1
        elif check.status is Status.FAIL:
            out = ET.SubElement(case, "system-out")
            out.text = _text(f"failed, not required: {outcome.check_text(check)}")
    for key, value in counts.items():
        suite.set(key, str(value))
    return suite
