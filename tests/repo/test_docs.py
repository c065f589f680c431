"""The user documentation stays true to the repository: links resolve, repository paths exist.

Walks README.md, docs/**/*.md and benchmarks/README.md. Fails on

- a relative Markdown link (or image) whose target does not exist (``#anchors`` stripped;
  http(s)/mailto links are not followed);
- a repository path in an inline code span or in a link's text, starting with one of PREFIXES, that
  does not exist (``*`` patterns are globbed; placeholders with ``<`` or ``{`` are skipped; ``path:line`` and
  trailing punctuation are stripped). Fenced code blocks are not checked for paths: they hold command
  lines and layout trees, whose paths are relative or illustrative;
- ``issue <number>`` or ``../shared`` anywhere, fenced blocks included;
- a README.md longer than README_MAX_LINES lines.

Pure Python, no torch: it runs in well under a second.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = ("recipes/", "benchmarks/", "docs/", "hf_zero/", "tests/", ".ci/")
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold code spans and nested brackets one level deep
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LINE_SUFFIX = re.compile(r":\d+(?:[-:]\d+)?$")
TRAILING = ".,;:!?)]}'\""
LEADING = "([{'\""


def doc_files(root: Path = ROOT) -> list:
    files = [root / "README.md", *sorted((root / "docs").glob("**/*.md")), root / "benchmarks" / "README.md"]
    return [f for f in files if f.is_file()]


def scan(path: Path):
    """(line number, line, inside a fenced block) for each line of a Markdown file."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            yield number, line, True
            fenced = not fenced
            continue
        yield number, line, fenced


def links(line: str) -> list:
    """(text, target) of each inline link or image; a `[a](b)` inside a code span is not a link."""
    text = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)
    return [(m.group(1), m.group(2)) for m in LINK.finditer(text)]


def link_targets(line: str) -> list:
    text = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)
    targets = [target for _, target in links(line)]
    reference = REFERENCE_DEF.match(text)
    if reference:
        targets.append(reference.group(1))
    return targets


def is_external(target: str) -> bool:
    return bool(SCHEME.match(target)) or target.startswith("//")


def broken_link(doc: Path, target: str, root: Path = ROOT) -> str | None:
    """Why a link target is wrong, or None when it is fine (external, anchor-only or an existing file)."""
    if is_external(target) or target.startswith("#"):
        return None
    bare = target.split("#", 1)[0].split("?", 1)[0]
    if not bare:
        return None
    if bare.startswith("/"):
        return "absolute link (write it relative to the document)"
    resolved = (doc.parent / bare).resolve()
    if not resolved.exists():
        return "link target does not exist"
    if root not in (resolved, *resolved.parents):
        return "link target is outside the repository"
    return None


def path_candidates(span: str) -> list:
    """Tokens of a code span (or a link's text) that look like repository paths."""
    found = []
    for token in span.split():
        if "=" in token:
            token = token.rsplit("=", 1)[1]
        token = token.lstrip(LEADING).rstrip(TRAILING)
        token = LINE_SUFFIX.sub("", token).rstrip(TRAILING)
        if token.startswith("./"):
            token = token[2:]
        if token.startswith(PREFIXES):
            found.append(token)
    return found


def missing_path(token: str, root: Path = ROOT) -> str | None:
    """Why a repository path is wrong, or None when it exists (or is a placeholder)."""
    if "<" in token or "{" in token:
        return None
    bare = token.split("#", 1)[0]
    if any(ch in bare for ch in "*?["):
        return None if any(root.glob(bare)) else "no file matches this pattern"
    target = root / bare
    if bare.endswith("/"):
        return None if target.is_dir() else "folder does not exist"
    return None if target.exists() else "path does not exist"


def link_problems(doc: Path, root: Path = ROOT) -> list:
    problems = []
    for number, line, fenced in scan(doc):
        if fenced:
            continue
        for target in link_targets(line):
            why = broken_link(doc, target, root)
            if why:
                problems.append(f"{doc.relative_to(root)}:{number}: {why}: ({target})")
    return problems


def path_problems(doc: Path, root: Path = ROOT) -> list:
    problems = []
    for number, line, fenced in scan(doc):
        if fenced:
            continue
        # code spans anywhere (link texts included), and the plain text of links: [hf_zero/x.py](...)
        # (link targets themselves are relative to the document and checked by link_problems)
        spans = [m.group(2) for m in CODE_SPAN.finditer(line)]
        spans += [CODE_SPAN.sub(" ", text) for text, _ in links(line)]
        for span in spans:
            for token in path_candidates(span):
                why = missing_path(token, root)
                if why:
                    problems.append(f"{doc.relative_to(root)}:{number}: {why}: `{token}`")
    return problems


def text_problems(doc: Path, root: Path = ROOT) -> list:
    problems = []
    for number, line, _ in scan(doc):
        for match in ISSUE.finditer(line):
            problems.append(f"{doc.relative_to(root)}:{number}: issue number in the docs: {match.group(0)!r}")
        if "../shared" in line:
            problems.append(f"{doc.relative_to(root)}:{number}: path outside the repository: '../shared'")
    return problems


def report(problems: list) -> str:
    return f"{len(problems)} problem(s) in the docs:\n" + "\n".join(problems)


# ---- the repository's docs ------------------------------------------------------------------------

def test_docs_exist():
    names = [f.relative_to(ROOT).as_posix() for f in doc_files()]
    for required in ("README.md", "docs/README.md", "benchmarks/README.md"):
        assert required in names, f"{required} is missing"


def test_relative_links_resolve():
    problems = [p for doc in doc_files() for p in link_problems(doc)]
    assert not problems, report(problems)


def test_repository_paths_exist():
    problems = [p for doc in doc_files() for p in path_problems(doc)]
    assert not problems, report(problems)


def test_no_issue_numbers_or_outside_paths():
    problems = [p for doc in doc_files() for p in text_problems(doc)]
    assert not problems, report(problems)


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md:{lines}: {lines} lines, at most {README_MAX_LINES}; move detail to docs/"


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / "docs" / t.split("#", 1)[0]).resolve() for line in index.splitlines() for t in link_targets(line)}
    pages = [p for p in sorted((ROOT / "docs").glob("**/*.md")) if p.name != "README.md"]
    unlisted = [p.relative_to(ROOT).as_posix() for p in pages if p.resolve() not in linked]
    assert not unlisted, "docs/README.md does not link: " + ", ".join(unlisted)


# ---- the checker itself, on made-up pages ---------------------------------------------------------

@pytest.fixture
def repo(tmp_path):
    tmp_path = tmp_path.resolve()
    (tmp_path / "docs").mkdir()
    (tmp_path / "recipes" / "accelerate").mkdir(parents=True)
    (tmp_path / "recipes" / "zero3.json").write_text("{}")
    (tmp_path / "recipes" / "accelerate" / "zero3.yaml").write_text("")
    (tmp_path / "benchmarks" / "2xH200").mkdir(parents=True)
    (tmp_path / "benchmarks" / "2xH200" / "results.json").write_text("{}")
    return tmp_path


def write(repo, text, name="docs/page.md"):
    page = repo / name
    page.write_text(text, encoding="utf-8")
    return page


def test_checker_finds_a_broken_link(repo):
    page = write(repo, "ok [r](../benchmarks/2xH200/results.json#top) [web](https://example.com)\n"
                       "[gone](missing.md) ![img](../benchmarks/2xH200/nope.png)\n[abs](/etc/passwd)\n")
    problems = link_problems(page, repo)
    assert len(problems) == 3
    assert problems[0] == "docs/page.md:2: link target does not exist: (missing.md)"
    assert "nope.png" in problems[1] and "absolute link" in problems[2]


def test_checker_finds_a_missing_repository_path(repo):
    page = write(repo, "Use `recipes/zero3.json`, `recipes/accelerate/*.yaml`, `benchmarks/<machine>/results.json`\n"
                       "and `python train.py --deepspeed=recipes/zero3.json`, `recipes/zero3.json:12`.\n"
                       "Not `recipes/zero9.json`, nor `recipes/*.toml`, nor `benchmarks/1xH200/`.\n"
                       "```\nhf_zero/not/checked/in/fences.py\n```\n"
                       "[benchmarks/2xH200/gone.json](../benchmarks/2xH200/gone.json) [results](../benchmarks/2xH200/results.json)\n")
    problems = path_problems(page, repo)
    assert problems == [
        "docs/page.md:3: path does not exist: `recipes/zero9.json`",
        "docs/page.md:3: no file matches this pattern: `recipes/*.toml`",
        "docs/page.md:3: folder does not exist: `benchmarks/1xH200/`",
        "docs/page.md:7: path does not exist: `benchmarks/2xH200/gone.json`",
    ]


def test_checker_finds_issue_numbers_and_shared_paths(repo):
    page = write(repo, "As issue 6 asked.\n```\ncat ../shared/notes.md\n```\nThe Issues 12 list; tissue 3 is fine.\n")
    assert text_problems(page, repo) == [
        "docs/page.md:1: issue number in the docs: 'issue 6'",
        "docs/page.md:3: path outside the repository: '../shared'",
        "docs/page.md:5: issue number in the docs: 'Issues 12'",
    ]


def test_versions_page_quotes_the_recorded_newest_releases():
    """docs/versions.md's "newest tested" column is the committed record make test-newest wrote, not a list written by
    hand. (make test-newest rewrites the record for its own run; this test runs in make test, against the commit.)"""
    from hf_zero.compat import releases

    rows = {}
    for line in (ROOT / "docs" / "versions.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].split(" ")[0] in releases.FLOORS:
            rows[cells[0].split(" ")[0]] = cells[2]
    assert rows == releases.NEWEST_TESTED
