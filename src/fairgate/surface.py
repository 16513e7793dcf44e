"""A package's public surface, loaded on first use.

Every package of fairgate names what other packages may import from it in its ``__all__``
(pinned by ``tests/unit/test_package_surface.py``), as httpx does. Unlike httpx, a package does
not import those names when it is imported: ``fairgate.path``'s surface includes its Starlette
edge and ``fairgate.providers``' the aiohttp client, and loading them whenever a plain
translation table or a record is imported would undo the import floors' point (a module loads
what it uses, not its package's whole surface) and could close an import cycle through a
package's ``__init__``.

So a package lists its surface once, as imports under ``if TYPE_CHECKING:`` (what mypy and
ruff read) and in ``__all__``, and sets ``__getattr__ = lazy_surface(__name__)`` in that
block's ``else`` (hidden from mypy, so a name missing from the surface is still a type
error at the importer): the first
``from fairgate.quota import QuotaEngine`` reads that import block (one parse, then cached),
imports the defining module and keeps the value on the package. A name not in the block is an
``AttributeError`` as usual, so ``from fairgate.path import proxy`` still imports the submodule.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["lazy_surface", "surface_modules"]


def surface_modules(package: str) -> dict[str, str]:
    """Name → defining module, from the ``if TYPE_CHECKING:`` imports of ``package``'s
    ``__init__.py`` (the one list of its surface; absolute imports only)."""
    source = Path(str(sys.modules[package].__file__)).read_text(encoding="utf-8")
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            if isinstance(imp, ast.ImportFrom) and imp.module is not None and imp.level == 0:
                for alias in imp.names:
                    out[alias.asname or alias.name] = imp.module
    return out


def lazy_surface(package: str) -> Callable[[str], object]:
    """The module ``__getattr__`` (PEP 562) of ``package``: a surface name is imported from its
    defining module on first access and kept on the package, so the next access is a plain
    attribute read."""
    modules: dict[str, str] | None = None

    def __getattr__(name: str) -> object:
        nonlocal modules
        if modules is None:
            modules = surface_modules(package)
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
