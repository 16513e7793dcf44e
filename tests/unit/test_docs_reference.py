"""The docs site's reference pages are generated from the code (``scripts/mkdocs_hooks.py``):
every config field, every admin route and every CLI command must appear, so a new setting can
never be missing from the docs. (``make docs`` builds the whole site with ``--strict``.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from fairgate.config import Config

HOOKS = Path(__file__).resolve().parents[2] / "scripts" / "mkdocs_hooks.py"


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", HOOKS)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mkdocs_hooks", mod)
    spec.loader.exec_module(mod)
    return mod


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    hooks = _hooks()
    if model in seen:
        return seen
    seen.add(model)
    for info in model.model_fields.values():
        for sub in hooks._submodels(info.annotation):
            _models(sub, seen)
    return seen


def test_every_config_field_is_in_the_configuration_reference() -> None:
    text = _hooks().config_reference()
    for model in _models(Config, set()):
        assert f"*{model.__name__}*" in text
        for name, info in model.model_fields.items():
            assert f"| `{info.alias or name}` |" in text, f"{model.__name__}.{name}"


def test_every_config_field_has_a_description() -> None:
    # the reference's description column was empty for 81 of 90 fields (issue 48): every field
    # of every model reachable from Config says in its Field(description=…) what it does
    empty = [
        f"{model.__name__}.{name}"
        for model in _models(Config, set())
        for name, info in model.model_fields.items()
        if not (info.description or "").strip()
    ]
    assert empty == []


def test_an_enum_default_shows_as_its_value() -> None:
    text = _hooks().config_reference()
    assert not re.search(r"<\w+\.\w+: ", text)  # no enum repr anywhere
    policy = next(line for line in text.splitlines() if line.startswith("| `policy` |"))
    assert "| `hard` |" in policy
    share = next(line for line in text.splitlines() if line.startswith("| `share_mode` |"))
    assert "| `static` |" in share


#: A sample of each generated reference's entries (the routes and commands most likely to be
#: added without a docstring), and one line each reference writes of its own.
_CLI_COMMANDS = (
    "serve",
    "demo",
    "keys create",
    "keys rotate",
    "keys revoke",
    "keys list",
    "pools usage",
    "connections test",
    "combos show",
    "config check",
    "health",
)


@pytest.mark.parametrize(
    ("reference", "lines"),
    [
        pytest.param(
            "admin_api_reference",
            (
                "### `POST /api/keys/{key_id}/rotate`",
                "### `POST /api/connections/{connection_id}/test`",
                "### `GET /api/combos/{name}/stats`",
                "### `PUT /api/settings`",
                "### `GET /api/quota/pools/{pool_id}/usage`",
                "| `lastUsedMs` |",
            ),
            id="admin-routes",
        ),
        pytest.param(
            "cli_reference",
            (*(f"### `fairgate {cmd}`" for cmd in _CLI_COMMANDS), "(env `FAIRGATE_ADMIN_KEY`)"),
            id="cli-commands",
        ),
    ],
)
def test_every_route_and_command_is_in_its_reference(
    reference: str, lines: tuple[str, ...]
) -> None:
    text = getattr(_hooks(), reference)()
    assert [line for line in lines if line not in text] == []


def test_the_markers_are_replaced() -> None:
    hooks = _hooks()
    page = "# x\n\n<!-- fairgate:cli-reference -->\n"
    out = hooks.on_page_markdown(page, page=None, config=None, files=None)
    assert "<!--" not in out
    assert "fairgate keys rotate" in out


def test_every_setting_is_in_the_settings_reference_with_its_sources() -> None:
    from fairgate.process.settings import Settings, leaves

    text = _hooks().settings_reference()
    settings = list(leaves(Settings))
    assert len(settings) > 60  # the areas' settings (http, store, resilience…) are listed too
    for name, info, origin in settings:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert origin.env or origin.db or origin.file, name  # every setting has a source
        for source in (origin.env, origin.db, origin.file):
            if source:
                assert f"`{source}`" in row, (name, source)
        assert (info.description or "").strip(), name
        assert _hooks()._cell(info.description or "") in row
    page = (HOOKS.parents[1] / "docs" / "reference" / "configuration.md").read_text()
    assert "<!-- fairgate:settings-reference -->" in page
