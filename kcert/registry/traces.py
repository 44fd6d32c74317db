"""Kernel durations read from traces: ``torch.profiler`` Chrome traces and JSONL.

Which events count, in a Chrome trace (``{"traceEvents": [...]}``, what
``torch.profiler.profile(...).export_chrome_trace(path)`` writes): complete
events (``"ph": "X"``) with a numeric ``dur`` (microseconds), whose ``cat``
is one of ``categories`` (default ``kernel`` and ``gpu_op``: the GPU kernels a
CUDA run records; a CPU-only torch records its operators as ``cpu_op``, so
name that category to ingest them) and whose ``name`` matches ``name``
(a regular expression, searched) when one is given. In JSONL, one object a
line: ``{"name": ..., "start_us": ..., "dur_us": ...}``; ``name`` filters the
same way. Nothing else in a trace is read, and nothing in it is executed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from kcert.registry.errors import InvalidInput
from kcert.registry.observation_models import MAX_PERF_SAMPLES, PerfSample

DEFAULT_CATEGORIES = ("kernel", "gpu_op")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past float's range: no duration
        return None
    return number if math.isfinite(number) else None


def _pattern(name: str | None) -> re.Pattern[str] | None:
    if name is None:
        return None
    try:
        return re.compile(name)
    except re.error as exc:
        raise InvalidInput(f"--name {name!r} is not a regular expression: {exc}") from exc


def chrome_trace_samples(
    data: bytes, *, categories: Iterable[str] = DEFAULT_CATEGORIES, name: str | None = None
) -> list[PerfSample]:
    """The kernel events of a Chrome trace (see the module's docstring for which)."""
    try:
        trace = json.loads(data)
    # ValueError: also JSONDecodeError and an integer past the interpreter's digit limit;
    # RecursionError: arrays or objects nested past its stack.
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"not a Chrome trace: the file is not JSON ({exc})") from exc
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise InvalidInput("not a Chrome trace: no traceEvents list")
    wanted = set(categories)
    pattern = _pattern(name)
    out: list[PerfSample] = []
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        if event.get("cat") not in wanted:
            continue
        label, start, dur = event.get("name"), _number(event.get("ts")), _number(event.get("dur"))
        if not isinstance(label, str) or start is None or dur is None or dur < 0:
            continue
        if pattern is not None and not pattern.search(label):
            continue
        out.append(PerfSample(name=label.replace("\x00", "")[:256], start_us=start, dur_us=dur))
    return _bounded(out, f"categories {sorted(wanted)}", name)


def jsonl_samples(data: bytes, *, name: str | None = None) -> list[PerfSample]:
    """Samples from JSONL, one ``{"name", "start_us", "dur_us"}`` object a line."""
    pattern = _pattern(name)
    out: list[PerfSample] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput("JSONL samples are UTF-8") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = PerfSample.model_validate_json(line)
        except ValueError as exc:
            raise InvalidInput(f"line {number}: not a {{name, start_us, dur_us}} object "
                               f"({str(exc).splitlines()[0]})") from None  # fmt: skip
        if pattern is None or pattern.search(sample.name):
            out.append(sample)
    return _bounded(out, "the JSONL", name)


def _bounded(samples: list[PerfSample], what: str, name: str | None) -> list[PerfSample]:
    if not samples:
        extra = f" matching --name {name!r}" if name else ""
        raise InvalidInput(f"no kernel events in {what}{extra}")
    if len(samples) > MAX_PERF_SAMPLES:
        raise InvalidInput(f"{len(samples)} events; ingest at most {MAX_PERF_SAMPLES} at once "
                           "(narrow them with --name)")  # fmt: skip
    return samples
