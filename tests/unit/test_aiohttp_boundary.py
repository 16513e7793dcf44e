"""aiohttp is an adapter's detail: only the upstream adapter and the mock provider import it.

Everything else talks to providers through the ports in :mod:`fairgate.providers.transport`,
so the HTTP client can change (or be replaced by an in-process handler) in one module. The
source is parsed, not imported, so a lazy import inside a function is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fairgate

SRC = Path(fairgate.__file__).resolve().parent
#: the upstream adapter, and the mock provider (a real aiohttp server speaking the wire formats)
ALLOWED = {"providers/upstream.py"}
ALLOWED_PREFIX = "providers/mock"


def _imports_aiohttp(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "aiohttp" or n.startswith("aiohttp.") for n in names):
            lines.append(node.lineno)
    return lines


def offenders(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED or rel.startswith(ALLOWED_PREFIX):
            continue
        for line in _imports_aiohttp(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"{rel}:{line}")
    return found


def test_only_the_adapter_and_the_mock_import_aiohttp() -> None:
    assert offenders(SRC) == []


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    # the guard itself can fail: each import form is reported, the allowed modules are not
    (tmp_path / "providers").mkdir()
    (tmp_path / "a.py").write_text("import aiohttp\n")
    (tmp_path / "b.py").write_text("def f():\n    from aiohttp import web\n")
    (tmp_path / "c.py").write_text("import os, aiohttp.web as w\n")
    (tmp_path / "d.py").write_text("import aiohttpx\nfrom .aiohttp import x\n")
    (tmp_path / "providers" / "upstream.py").write_text("import aiohttp\n")
    (tmp_path / "providers" / "mock.py").write_text("from aiohttp import web\n")
    assert offenders(tmp_path) == ["a.py:1", "b.py:2", "c.py:1"]
