"""The documentation stays a front door plus current pages, and the project's files speak of
the product only.

- README.md is short, maps every page of docs/, and shows the test command `.ci/run` runs.
- Every relative link (and its #anchor) in the Markdown pages resolves.
- No tracked text file narrates how or when the work was done (sessions, stops, rounds,
  first-person trials, dated measurements): that belongs in commit messages.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300

# Wording about the work rather than the product. Each alternative names one habit.
HISTORY = re.compile(
    "|".join(
        [
            # a stop of the work ("this stop", "the previous stop"), not a stop string or button
            r"\b(?:this|the next|the previous|the last|that|an earlier) stop\b"
            r"(?![- ](?:strings?|buttons?|tokens?|reasons?|sequences?|events?|texts?|words?))",
            # a working session, not a browser or test session
            r"\b(?:this|the next|the previous|that|the same|an earlier|a later) session\b"
            r"(?!['’]s? (?:cookie|token|csrf))(?! (?:cookie|token|scope|fixture))",
            r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) session\b",
            r"\bearlier sessions\b|\bsession by session\b",
            r"\bround[- ](?:one|two|three|four|five|[0-9])\b",
            r"\b(?:this|the previous|the next|that|in this) round\b(?! of\b)",
            r"\bI (?:tried|measured|found|ran|did|reverted|timed|saw|checked|noticed|think)\b",
            r"\bwe (?:tried|measured|found|reverted)\b",
            r"\bpreviously\b",
            r"\b(?:measured|run|ran|timed) (?:on )?20\d\d-\d\d-\d\d\b",
            r"\bissue #?\d+\b",
        ]
    ),
    re.IGNORECASE,
)

TEXT_SUFFIXES = {".md", ".py", ".toml", ".sh", ".html", ".cfg", ".ini", ".yml", ".yaml"}
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()


def tracked_text_files() -> list[Path]:
    """The repository's tracked text files that speak to readers."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = Path(name)
        if not name or name == SELF:
            continue
        wanted = (
            path.suffix in TEXT_SUFFIXES
            or name.startswith(("templates/", ".ci/"))
            or path.name == "Dockerfile"
        )
        if wanted and (ROOT / path).is_file():
            files.append(ROOT / path)
    return files


def history_lines(path: Path) -> list[str]:
    """`file:line: text` for each line of `path` that narrates the work."""
    hits = []
    rel = path.relative_to(ROOT).as_posix()
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if HISTORY.search(line):
            hits.append(f"{rel}:{number}: {line.strip()[:120]}")
    return hits


def test_project_files_speak_of_the_product_not_of_the_work() -> None:
    files = tracked_text_files()
    assert README in files
    hits = [hit for path in files for hit in history_lines(path)]
    assert not hits, "history belongs in commit messages:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "line",
    [
        "A third run, in the next stop (same code): 133 tok/s.",
        "Measured in one session with 6 pairs each; the ninth session's run.",
        "The front's CPU per token fell in this round when the client was reused.",
        "I tried letting a stream keep guessing; it was reverted.",
        "Measured on 2026-11-30 on the 2-core box.",
    ],
)
def test_the_history_pattern_catches_narrative(line: str) -> None:
    assert HISTORY.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "Stop (Esc) keeps the partial answer; this stop string is held back.",
        "End this session's cookie; the session token is hashed.",
        "@pytest.fixture(scope='session') loads the model once per test session.",
        "Rounds of 8 streams; round-robin over users; 2026-12-02, 2-core AMD EPYC.",
    ],
)
def test_the_history_pattern_spares_the_product(line: str) -> None:
    assert not HISTORY.search(line)


# -- links -------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def markdown_pages() -> list[Path]:
    pages = [README, ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += [ROOT / "models" / "README.md", ROOT / "chatbox" / "engine" / "README.md"]
    return [p for p in pages if p.is_file()]


def prose(text: str) -> str:
    """Markdown without its code blocks and code spans (links there are not links)."""
    text = FENCE.sub("", text)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)  # indented code
    return CODE_SPAN.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a page's headings make (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path, base: Path = ROOT) -> list[str]:
    """`page: target (why)` for each relative link of `page` that leads nowhere."""
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(base).as_posix()}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = markdown_pages()
    assert len(pages) > 3
    broken = [b for page in pages for b in broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Some `code` heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#some-code-heading) [gone](missing.md) [bad](other.md#nope)\n"
        "`[in code](nowhere.md)` [web](https://example.com/x.md)\n"
    )
    found = [b.split(": ", 1)[1] for b in broken_links(page, base=tmp_path)]
    assert found == ["missing.md (no such file)", "other.md#nope (no such heading)"]


# -- the README ----------------------------------------------------------------------------


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_maps_every_page_of_docs() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "docs").glob("*.md"))
        if f"({p.relative_to(ROOT).as_posix()})" not in text
    ]
    assert not missing, f"pages of docs/ the README does not link: {missing}"


def test_the_readme_shows_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = "bash scripts/setup.sh --test && bash scripts/test.sh"
    assert f"{command} || exit 1" in ci.splitlines()  # any failing pass fails CI
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    assert any(command in block.splitlines() for block in blocks)
