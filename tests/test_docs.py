"""The docs are current: docs/config.md is rendered from the config dataclasses, and every relative link of
README.md and docs/*.md points to a file (and heading) that exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from workbench.config.reference import REFERENCE, SECTIONS, field_docs, render_reference


def test_every_config_field_has_a_docstring():
    missing = [
        f"{cls.__name__}.{f.name}"
        for _, cls in SECTIONS
        for f in dataclasses.fields(cls)
        if f.name not in field_docs(cls) and f.name not in ("task", "train", "hacpo", "output")
    ]
    assert missing == [], f"config fields without a docstring under them: {missing}"


def test_docs_config_md_is_current():
    assert REFERENCE.read_text(encoding="utf-8") == render_reference(), (
        "docs/config.md is stale: run "
        "`python -c 'from workbench.config.reference import write_reference; write_reference()'`"
    )


# ----------------------------------------------------------------------------------------- links

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
GENERATED = re.compile(r"<!-- results:start -->.*?<!-- results:end -->", re.S)


def _prose(text: str) -> str:
    """The text without fenced code blocks (a ``# comment`` in a code block is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in anchors else f"{slug}-1")
    return anchors


def _broken_links(path: Path, text: str) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    return broken


def test_every_relative_link_of_readme_and_docs_resolves():
    broken = [
        b
        for path in DOCUMENTS
        for b in _broken_links(path, GENERATED.sub("", path.read_text(encoding="utf-8")))
    ]
    assert broken == [], "links to missing files or headings:\n" + "\n".join(broken)


@pytest.mark.parametrize("name", ["results.md", "results_real_pair.md"])
def test_generated_results_section_links_resolve(name):
    path = ROOT / "docs" / name
    generated = GENERATED.search(path.read_text(encoding="utf-8"))
    assert generated is not None, f"docs/{name} has no generated results section"
    assert _broken_links(path, generated.group(0)) == []
