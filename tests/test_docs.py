"""Every public name has a docstring (the API reference is generated from them), and the
docs link only to pages that exist."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import nbjit

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _public_members(obj):
    for name, member in vars(obj).items():
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        yield name, member


def test_every_public_name_and_method_has_a_docstring():
    missing = []
    for name in nbjit.__all__:
        obj = getattr(nbjit, name)
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
        if inspect.isclass(obj) and obj.__module__.startswith("nbjit"):
            for mname, member in _public_members(obj):
                doc = member.__doc__ if not isinstance(member, property) else (member.fget.__doc__ or "")
                if not (doc or "").strip() and mname not in ("to_json",):
                    missing.append(f"{name}.{mname}")
    assert not missing, f"no docstring: {', '.join(missing)}"


def test_links_between_pages_resolve():
    pages = {p.name for p in DOCS.glob("*.md")}
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert target in pages, f"{page.name} links to {target}, which does not exist"


ROOT = DOCS.parent
RESULTS = ROOT / "benchmarks" / "results"
MAX_WORDS = 4000
# what a development log says and a user's page need not: a work session, an issue number, a
# machine's lease ("release" is a word of its own)
LOG_WORDS = re.compile(r"\bsession \d+|\bissue #?\d+|\bleases?\b", re.I)


def test_pages_are_user_docs_not_a_development_log():
    """Each page says what a feature does, how to use it, its current figures and limits: no
    page over 4,000 words, and no session, issue number or lease (history goes to
    benchmarks/results/HISTORY.md or the CHANGELOG)."""
    long = {p.name: n for p in DOCS.glob("*.md") if (n := len(p.read_text().split())) > MAX_WORDS}
    assert not long, f"pages over {MAX_WORDS} words: {long}"
    found = [f"{p.name}:{i}: {m[0]!r}" for p in sorted(DOCS.glob("*.md"))
             for i, line in enumerate(p.read_text().splitlines(), 1) for m in LOG_WORDS.finditer(line)]
    assert not found, "development-log words in docs/: " + "; ".join(found)


def test_benchmark_results_one_current_file_each_and_cited_files_exist():
    """benchmarks/results/ holds one history file and, per benchmark (and machine, or host it
    serves), one current result named for the day it ran; every result file the README and the
    docs cite is there."""
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    current: dict[str, str] = {}
    for f in sorted(RESULTS.iterdir()):
        if f.name == "HISTORY.md":
            continue
        m = re.fullmatch(r"([a-z0-9_]+)_\d{4}-\d{2}-\d{2}\.json", f.name)
        assert m and any(m[1] == s or m[1].startswith(s + "_") for s in scripts), \
            f"{f.name}: not <benchmark>[_<machine>]_<date>.json of a benchmarks/ script"
        assert m[1] not in current, f"two current results of {m[1]}: {current[m[1]]}, {f.name} (fold one into HISTORY)"
        current[m[1]] = f.name
    cited = set()
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        cited |= set(re.findall(r"benchmarks/results/([A-Za-z0-9_.-]+\.(?:json|md|txt))", page.read_text()))
        cited |= set(re.findall(r"`([a-z_0-9]+_\d{4}-\d{2}-\d{2}\.json)`", page.read_text()))
    missing = sorted(c for c in cited if not (RESULTS / c).is_file())
    assert not missing, f"cited but not in benchmarks/results/: {missing}"


# `pip install nbjit`, `pip install "nbjit-core[cu13]"`, `pip install 'nbjit[dask]'`: names nbjit has not
# published; what works is a checkout (pip install -e '.[cu13]') or a wheel built from one
_UNPUBLISHED = re.compile(r"""pip install\s+(?:-U\s+)?["']?nbjit(?:-core)?(?:\[|["'\s)`]|$)""", re.M)


def test_install_suggestions_name_what_can_be_installed():
    """The README, the docs, the examples and every message nbjit prints install from a checkout
    or a built wheel; the published names appear only in the README's release plan, each marked."""
    files = [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "examples").rglob("*.md"), *(ROOT / "nbjit").glob("*.py")]
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if _UNPUBLISHED.search(line) and "(once published)" not in line]
    assert not bad, "install commands for names not on PyPI:\n" + "\n".join(bad)


def test_readme_opens_with_purpose_example_and_setup():
    """Within its first 25 lines the README says what nbjit is for, shows a short example and
    gives the two set-up commands CI runs (.ci/run: exactly those)."""
    head = (ROOT / "README.md").read_text().splitlines()[:25]
    commands = ['python3 -m pip install -e ".[cu13,test]"', "python3 -m pytest"]
    for c in commands:
        assert any(line.split("#")[0].strip() == c for line in head), f"{c!r} not in the README's first 25 lines"
        assert re.search(rf"^{re.escape(c)}$", (ROOT / ".ci" / "run").read_text(), re.M), f".ci/run does not run {c!r}"
    assert "```python" in head, "no example in the README's first 25 lines"
    example = head[head.index("```python") + 1:]
    assert 4 <= example.index("```") <= 8, "the first example is not a few lines"
