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
