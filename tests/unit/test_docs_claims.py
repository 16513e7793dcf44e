"""What the docs say about the code, checked against the code: the routes they name exist with
the method they name, the endpoint list is complete, install commands name what the project
defines, and nothing a reader needs lives outside the repository. The walkthroughs themselves
are run by ``tests/e2e/test_docs_run.py``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fairgate.install import extra_hint

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _texts() -> list[tuple[Path, str]]:
    sources = [*PAGES, REPO / "README.md", *sorted((REPO / "src").rglob("*.py"))]
    return [(p, p.read_text()) for p in sources]


def test_no_install_command_names_a_package_index_release() -> None:
    """fairgate is installed from its repository: ``pip install 'fairgate[otel]'`` finds no
    package, so no page and no message may tell a reader to run it."""
    pattern = re.compile(r"pip install\s+['\"]?fairgate\b")
    found = [f"{p.relative_to(REPO)}" for p, text in _texts() if pattern.search(text)]
    assert found == []


@pytest.mark.parametrize("extra", ["redis", "otel", "sim"])
def test_the_install_hint_names_an_extra_the_project_defines(extra: str) -> None:
    assert extra in EXTRAS
    assert f"pip install -e '.[{extra}]'" in extra_hint(extra)


def test_every_extra_a_page_installs_is_defined() -> None:
    named = {m for _, text in _texts() for m in re.findall(r"\.\[([a-z-]+)\]'", text)}
    assert named, "the pages name no extra: the pattern no longer matches how they do"
    assert named <= set(EXTRAS), named - set(EXTRAS)
