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


@pytest.mark.parametrize("extra", ["otel", "sim"])
def test_the_install_hint_names_an_extra_the_project_defines(extra: str) -> None:
    assert extra in EXTRAS
    assert f"pip install -e '.[{extra}]'" in extra_hint(extra)


def test_every_extra_a_page_installs_is_defined() -> None:
    named = {m for _, text in _texts() for m in re.findall(r"\.\[([a-z-]+)\]'", text)}
    assert named, "the pages name no extra: the pattern no longer matches how they do"
    assert named <= set(EXTRAS), named - set(EXTRAS)


# -- the routes the pages name ----------------------------------------------------------------

#: ``METHOD /api/…`` or ``METHOD /v1/…`` as the pages write a call (query strings dropped)
CALL = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/(?:api|v1)/[^\s`)\"'?]*)")
#: named by a page as what fairgate does *not* serve (none today)
NOT_SERVED: set[tuple[str, str]] = set()


def _served(tmp_path: Path) -> set[tuple[str, str]]:
    """Every (method, path template) the gateway serves: the client routes and the admin API
    under ``/api``, from the app itself."""
    from starlette.routing import Mount, Route

    from fairgate.admin.testing import router as testing_router
    from fairgate.process.state import Gateway
    from fairgate.server.app import create_app

    app = create_app(Gateway(data_dir=tmp_path, env={}))
    out: set[tuple[str, str]] = set()
    for route in app.routes:
        if isinstance(route, Route) and route.methods:
            out |= {(m, route.path) for m in route.methods}
        elif isinstance(route, Mount) and route.path == "/api":
            spec = route.app.openapi()  # type: ignore[attr-defined]  # the admin FastAPI app
            for path, item in spec["paths"].items():
                out |= {(m.upper(), "/api" + path) for m in item}
    # the test clock's routes are kept out of the schema (they answer 404 without it)
    for test_route in testing_router.routes:
        out |= {(m, "/api" + test_route.path) for m in getattr(test_route, "methods", ())}
    return out


def _matches(path: str, template: str) -> bool:
    """A page's path (``{id}`` or a real value in a segment) against a route's template."""
    got, want = path.rstrip("/").split("/"), template.rstrip("/").split("/")
    return len(got) == len(want) and all(
        w.startswith("{") or g.startswith("{") or g == w for g, w in zip(got, want, strict=True)
    )


def test_every_call_a_page_names_exists_with_that_method(tmp_path: Path) -> None:
    """A page that says ``PATCH /api/settings`` where the route is ``PUT`` sends readers to a
    405: each ``METHOD /api/…`` and ``METHOD /v1/…`` a page names is a route of that method."""
    served = _served(tmp_path)
    named = {(m, p, page.name) for page in PAGES for m, p in CALL.findall(page.read_text())}
    assert len(named) > 20, "the pages name few calls: the pattern no longer matches them"
    wrong = sorted(
        f"{page}: {m} {p}"
        for m, p, page in named
        if (m, p) not in NOT_SERVED and not any(sm == m and _matches(p, sp) for sm, sp in served)
    )
    assert wrong == []


def test_the_endpoint_list_names_every_client_route(tmp_path: Path) -> None:
    """Running it's list of endpoints is where a reader looks for what the gateway serves."""
    text = (DOCS / "operations.md").read_text().split("## Endpoints", 1)[1].split("\n## ", 1)[0]
    client = sorted((m, p) for m, p in _served(tmp_path) if p.startswith("/v1/") and m != "HEAD")
    assert client
    missing = [f"{m} {p}" for m, p in client if f"`{m} {p}`" not in text]
    assert missing == []


# -- everything in the repository ------------------------------------------------------------


def test_no_page_sends_the_reader_outside_the_repository() -> None:
    """The design document the pages once pointed at lived beside the repository, where a
    reader of the repository (or of the site built from it) cannot follow: a page may link to
    the web, but not to a file outside the repository."""
    outside = re.compile(r"\.\./shared|shared/DESIGN|DESIGN\.md|SPEC\.md|\bSPEC §")
    found = [
        f"{p.relative_to(REPO)}: {m.group()}"
        for p in PAGES
        for m in outside.finditer(p.read_text())
    ]
    assert found == []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).resolve().is_relative_to(REPO), (page.name, target)
