"""The configuration reference (docs/config.md) is rendered from the config dataclasses and is current."""

from __future__ import annotations

import dataclasses

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
