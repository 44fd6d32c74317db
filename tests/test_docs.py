"""The repository documents its own formats: every link in README.md and docs/ resolves
inside the repository, and nothing points at design notes kept outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")))]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens."""
    anchors = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+)$", line)):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    assert "docs/spec.md" in DOCS and "docs/cli.md" in DOCS
    broken = []
    for name in DOCS:
        path = ROOT / name
        for target in LINK.findall(path.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # an absolute URL
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.is_file() or ROOT not in dest.parents:
                broken.append(f"{name}: {target}")
            elif anchor and anchor not in _anchors(dest.read_text()):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, broken


def test_readme_links_each_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in ("spec", "certificate", "api", "log", "cli", "threat-model", "checks"):
        assert f"(docs/{doc}.md)" in readme, doc


def test_nothing_points_at_notes_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=False).stdout.split()  # fmt: skip
    if not tracked:  # not a git checkout (an unpacked sdist): read the usual folders
        folders = ("kcert", "tests", "docs", "bench", "scripts", "examples")
        tracked = [str(p.relative_to(ROOT)) for d in folders for p in (ROOT / d).rglob("*")]
        tracked.append("README.md")
    outside = re.compile(r"DESIGN\.md|STYLE\.md|\.\./shared")
    hits = []
    for name in tracked:
        path = ROOT / name
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1)
                 if outside.search(line)]  # fmt: skip
    assert not hits, hits
