"""The environment is read in one place (:mod:`fairgate.environment`) and passed down.

import-linter cannot see attribute reads, so this walks the source: any ``os.environ``,
``os.getenv``, ``os.putenv`` or ``os.unsetenv`` (or ``environ``/``getenv`` imported from
``os``) outside ``environment.py`` fails, with the file and line.

And the snapshot is read by the settings object only (issue 47, item 4): outside
``process/settings.py``, no module looks a setting's variable up in a mapping
(``env.get("FAIRGATE_…")``, ``env[NAME]`` with ``NAME = "QUOTA_…"``,
``env.get(f"RESILIENCE_{n}")``); an area declares its variables with ``From(env=…)`` and
receives its typed settings.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
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


def scan(root: Path, finder: Callable[[ast.Module], list[int]], allowed: set[str]) -> list[str]:
    """``file:line`` of every place ``finder`` reports in the sources under ``root``, but for
    the ``allowed`` files (paths relative to ``root``)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel not in allowed:
            out += [f"{rel}:{n}" for n in finder(ast.parse(path.read_text(encoding="utf-8")))]
    return out


def offenders(root: Path) -> list[str]:
    return scan(root, reads, {"environment.py"})


def test_only_the_environment_module_reads_the_environment() -> None:
    assert offenders(SRC) == []


def test_the_check_sees_each_form(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import os\nx = os.environ['A']\n")
    (tmp_path / "b.py").write_text("import os\ndef f():\n    return os.getenv('B')\n")
    (tmp_path / "c.py").write_text("from os import environ\n")
    (tmp_path / "d.py").write_text("import os\nos.putenv('D', '1')\nenviron = {}\n")
    (tmp_path / "environment.py").write_text("import os\nos.environ\n")
    assert offenders(tmp_path) == ["a.py:2", "b.py:3", "c.py:1", "d.py:2"]


#: The names of settings' variables: fairgate's own, and those fairgate reads of others
#: (uvicorn's FORWARDED_ALLOW_IPS, the OpenTelemetry SDK's OTEL_*).
VARIABLE = re.compile(r"^(FAIRGATE|QUOTA|RESILIENCE|OTEL|FORWARDED)_[A-Z0-9_]*$")
#: The one module that looks variables up in the snapshot.
LOOKS_UP = {"process/settings.py", "environment.py"}


def _names_a_variable(node: ast.expr, constants: dict[str, str]) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(VARIABLE.match(node.value))
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.JoinedStr) and node.values:  # f"RESILIENCE_{name.upper()}"
        first = node.values[0]
        return isinstance(first, ast.Constant) and bool(
            VARIABLE.match(str(first.value).rstrip("_") + "_")
        )
    return False


def lookups(tree: ast.Module) -> list[int]:
    """Lines that look a variable name up: ``x.get(NAME…)`` or ``x[NAME]``."""
    constants = {
        target.id: node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and VARIABLE.match(node.value.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and _names_a_variable(node.args[0], constants)
        ) or (isinstance(node, ast.Subscript) and _names_a_variable(node.slice, constants)):
            found.append(node.lineno)
    return found


def lookers(root: Path) -> list[str]:
    return scan(root, lookups, LOOKS_UP)


def test_only_the_settings_object_looks_variables_up() -> None:
    assert lookers(SRC) == []


def test_the_lookup_check_sees_each_form(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f(env):\n    return env.get('FAIRGATE_PORT', '')\n")
    (tmp_path / "b.py").write_text(
        "NAME = 'QUOTA_STORE_DRIVER'\ndef f(env):\n    return env[NAME]\n"
    )
    (tmp_path / "c.py").write_text("def f(env, n):\n    return env.get(f'RESILIENCE_{n}')\n")
    (tmp_path / "d.py").write_text("def f(h):\n    return h.get('content-type'), h['FAIRGATE']\n")
    (tmp_path / "e.py").write_text("X = {'OTEL_SERVICE_NAME': 1}\nFrom(env='FAIRGATE_PORT')\n")
    (tmp_path / "process").mkdir()
    (tmp_path / "process" / "settings.py").write_text("env.get('FAIRGATE_PORT')\n")
    assert lookers(tmp_path) == ["a.py:2", "b.py:3", "c.py:2"]
