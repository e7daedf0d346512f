"""The docs live in the repository and say what they claim to: no file cites a design document
outside it, the results page is a page of results (short, claims first, no account of who ran what
when), and every link between the docs, and every section title the code cites, exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results.md"
MAX_RESULTS_LINES = 400

# An account of the work rather than of its results: sessions, numbered runs, runs not made, whose
# machine, when.
WORK_LOG = [
    r"\bsessions?\b",
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth) (run|session|round)\b",
    r"\b(seventh|eighth|ninth|tenth|eleventh|twelfth)\b",
    r"\bnot run again\b",
    r"\brerun'?s machine\b",
    r"\b20\d\d-\d\d-\d\d\b",  # a date
    r"\b\d\d:\d\d(:\d\d)?\s*(-\s*\d\d:\d\d(:\d\d)?\s*)?UTC\b",  # a time of day
]


def repo_files() -> list[Path]:
    """Files of the checkout that git tracks or would track (untracked but not ignored)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    paths = {ROOT / p for p in out.decode().split("\0") if p}
    return sorted(p for p in paths if p.is_file())  # a file deleted in the work tree is not there to read


def test_no_file_cites_a_design_document_outside_the_repository():
    me = Path(__file__).resolve()
    files = repo_files()
    assert ROOT / "docs" / "method.md" in files and len(files) > 100
    citing = [p.relative_to(ROOT).as_posix() for p in files if p != me and b"DESIGN.md" in p.read_bytes()]
    assert citing == [], f"cite docs/method.md or docs/architecture.md instead: {citing}"


def test_results_page_is_short_and_opens_with_the_claims():
    text = RESULTS.read_text()
    assert len(text.splitlines()) <= MAX_RESULTS_LINES
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "The claims", sections
    claims = text.split("## The claims", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in claims.splitlines() if re.match(r"\| [1-5][a-d]?\. ", line)]
    assert len(rows) >= 6, "the claims table lists each claim of docs/method.md"
    for row in rows:
        assert re.search(r"reproduced|not reproduced|inconclusive|not tested", row), row
        assert "](" in row, f"each claim links its evidence: {row}"


@pytest.mark.parametrize("pattern", WORK_LOG)
def test_results_page_gives_no_account_of_the_work(pattern):
    hits = [line for line in RESULTS.read_text().splitlines() if re.search(pattern, line, re.I)]
    assert hits == [], hits


def test_work_log_patterns_catch_a_log():
    log = ("A sixth run, on another machine (ninth session, 2026-12-04, 04:05-05:27 UTC); not run again; "
           "the rerun's machine was faster.")
    assert sum(bool(re.search(p, log, re.I)) for p in WORK_LOG) == len(WORK_LOG)


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    return [m.strip() for m in re.findall(r"^#{1,6} (.+)$", path.read_text(), re.M)]


def test_slug_follows_github():
    assert slug("The sandbox with power, long budget") == "the-sandbox-with-power-long-budget"
    assert slug("The paper's claims, and how the project tests them") == "the-papers-claims-and-how-the-project-tests-them"
    assert slug("`swarm_node/method/objective.py` (pure)") == "swarm_nodemethodobjectivepy-pure"


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_between_docs_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in {slug(h) for h in headings(path)}:
            broken.append(target)
    assert broken == [], f"{doc.relative_to(ROOT)}: {broken}"


def test_section_titles_the_code_cites_exist():
    cited = re.compile(r"(docs/(?:results|method|architecture)\.md),? [\"']([^\"'\n]+)[\"']")
    missing, seen = [], 0
    for path in repo_files():
        if path.suffix not in {".py", ".toml", ".md"} or path == Path(__file__).resolve():
            continue
        for doc, title in cited.findall(path.read_text(errors="replace")):
            seen += 1
            if not any(h.startswith(title) for h in headings(ROOT / doc)):  # the title, or its head
                missing.append(f"{path.relative_to(ROOT)}: {doc} {title!r}")
    assert seen > 3 and missing == [], missing
