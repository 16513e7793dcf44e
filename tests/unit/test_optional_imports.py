"""The base install serves: no module of the package needs an optional dependency to import.

`make demo` installs fairgate without extras, and an unconditional ``import redis`` in the
server once made its first command fail for every new user while the suite, which installs
every extra, stayed green. This test hides every distribution that is not in the closure of
fairgate's base requirements (OpenTelemetry, matplotlib, the SDKs, pytest itself, ...) behind
an import hook, then imports every module of the package in a fresh interpreter. A module that
needs an extra must import it where the feature is switched on, and say which extra to install
when it is missing (the tracing and simulate checks below).

The hidden set is computed, not listed: a new optional dependency is covered the day it is
added to an extra.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_PROBE = textwrap.dedent(
    r"""
    import importlib, importlib.abc, importlib.machinery, json, pkgutil, sys
    import importlib.metadata as md
    from pathlib import Path
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def base_closure():
        seen, todo = set(), ["fairgate"]
        while todo:
            name = canonicalize_name(todo.pop())
            if name in seen:
                continue
            seen.add(name)
            try:
                reqs = md.requires(name) or []
            except md.PackageNotFoundError:
                continue
            for raw in reqs:
                req = Requirement(raw)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    todo.append(req.name)
                    # an extra named in a base requirement (redis[hiredis]) is part of the base
                    for extra in req.extras:
                        for sub in md.requires(req.name) or []:
                            r = Requirement(sub)
                            if r.marker is not None and r.marker.evaluate({"extra": extra}):
                                todo.append(r.name)
        return seen

    allowed = base_closure()
    # hidden by file, not by top-level name: a namespace such as opentelemetry is shared by a
    # base distribution (fastapi needs opentelemetry-api) and optional ones (the SDK, exporters)
    hidden, hidden_files = [], set()
    for dist in md.distributions():
        if canonicalize_name(dist.metadata["Name"]) in allowed:
            continue
        hidden.append(canonicalize_name(dist.metadata["Name"]))
        for f in dist.files or []:
            if f.suffix in (".py", ".so", ".pyd"):
                hidden_files.add(str(dist.locate_file(f).resolve()))

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            origin = spec.origin if spec is not None else None
            if origin and str(Path(origin).resolve()) in hidden_files:
                raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
            return None

    for mod in list(sys.modules):  # packaging and its kin were needed above, not below
        origin = getattr(sys.modules[mod], "__file__", None)
        if origin and str(Path(origin).resolve()) in hidden_files:
            del sys.modules[mod]
    sys.meta_path.insert(0, Hide())

    import fairgate
    failures = {}
    names = ["fairgate"] + [
        m.name
        for m in pkgutil.walk_packages(fairgate.__path__, "fairgate.")
        # entry points, not libraries: __main__ runs the CLI, worker_protocol is imported by a
        # `serve --workers N` worker only, from the spec its parent put in the environment
        if not m.name.endswith(".__main__") and m.name != "fairgate.server.worker_protocol"
    ]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"hidden": hidden, "modules": len(names), "failures": failures}))
    """
)


def _probe() -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_every_module_imports_with_only_the_base_install() -> None:
    result = _probe()
    hidden = set(result["hidden"])  # type: ignore[call-overload]
    # the hook hides what it must: the extras' packages are installed here (dev), and hidden
    for optional in ("opentelemetry-sdk", "matplotlib", "pytest", "openai", "anthropic"):
        assert optional in hidden, f"{optional} should be outside the base install"
    # and leaves the base alone (redis is a base dependency: the store switch needs it)
    for base in ("redis", "hiredis", "starlette", "uvicorn", "aiohttp", "psycopg", "fairgate"):
        assert base not in hidden
    assert result["modules"] > 150  # type: ignore[operator]
    assert result["failures"] == {}


def test_tracing_without_its_extra_says_which_extra_to_install() -> None:
    code = textwrap.dedent(
        """
        import builtins, logging, sys
        real_import = builtins.__import__
        def fake(name, *a, **k):
            if name.startswith("opentelemetry"):
                raise ModuleNotFoundError(name)
            return real_import(name, *a, **k)
        builtins.__import__ = fake
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
        from fairgate.process import tracing
        plan = tracing.TracingSettings(endpoint="http://127.0.0.1:4318")
        on = tracing.configure(plan)
        print("ON" if on else "OFF")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    lines = out.strip().splitlines()
    assert lines[-1] == "OFF"
    assert any("'.[otel]'" in line for line in lines[:-1])
