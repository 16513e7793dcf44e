"""The environment is read in one place (:mod:`fairgate.environment`) and passed down.

import-linter cannot see attribute reads, so this walks the source: any ``os.environ``,
``os.getenv``, ``os.putenv`` or ``os.unsetenv`` (or ``environ``/``getenv`` imported from
``os``) outside ``environment.py`` fails, with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fairgate

SRC = Path(fairgate.__file__).resolve().parent
READERS = {"environ", "getenv", "putenv", "unsetenv", "environb", "getenvb"}


def reads(tree: ast.AST) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in READERS
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in READERS for a in node.names)
        ):
            found.append(node.lineno)
    return found


def offenders(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "environment.py":
            continue
        out += [f"{rel}:{n}" for n in reads(ast.parse(path.read_text(encoding="utf-8")))]
    return out


def test_only_the_environment_module_reads_the_environment() -> None:
    assert offenders(SRC) == []


def test_the_check_sees_each_form(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import os\nx = os.environ['A']\n")
    (tmp_path / "b.py").write_text("import os\ndef f():\n    return os.getenv('B')\n")
    (tmp_path / "c.py").write_text("from os import environ\n")
    (tmp_path / "d.py").write_text("import os\nos.putenv('D', '1')\nenviron = {}\n")
    (tmp_path / "environment.py").write_text("import os\nos.environ\n")
    assert offenders(tmp_path) == ["a.py:2", "b.py:3", "c.py:1", "d.py:2"]
