"""MkDocs hooks: the reference pages are generated from the code at build time.

A page holding one of the markers below gets it replaced by Markdown generated from the running
code, so nothing is kept by hand and nothing can drift:

- ``<!-- fairgate:settings-reference -->``: every field of the one settings object
  (``fairgate.process.settings.Settings``) with its environment variable, DB setting and config
  path, default, limits and description;
- ``<!-- fairgate:config-reference -->``: every section and field of the YAML config file, from
  the pydantic models in ``fairgate.config`` (types, defaults, limits, descriptions);
- ``<!-- fairgate:admin-api-reference -->``: every admin API route, from the app's OpenAPI schema;
- ``<!-- fairgate:cli-reference -->``: every ``fairgate`` command and option, from the Typer app.
"""

from __future__ import annotations

import enum
import tempfile
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# -- config -----------------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    """A reader's name for a field type: constraints dropped (they have their own column),
    enums and literals as their values."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _limits(info: FieldInfo) -> str:
    out: list[str] = []
    for m in info.metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
        for attr in ("min_length", "max_length", "pattern"):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{attr.replace('_', ' ')} {v}")
    return ", ".join(out)


def _shown(value: Any) -> str:
    """A default as the YAML file spells it: an enum member as its value (``hard``, not
    ``<Policy.HARD: 'hard'>``), None as ``null``, anything else as its repr."""
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, Path):
        return f"`{value}`"
    return "`null`" if value is None else f"`{value!r}`"


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(see the section)"
        return _shown(value)
    if info.default is PydanticUndefined:
        return ""
    return _shown(info.default)


def _submodels(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _submodels(arg)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_reference() -> str:
    from fairgate.config import Config

    seen: set[type[BaseModel]] = set()
    queue: list[tuple[str, type[BaseModel]]] = [("(top level)", Config)]
    parts: list[str] = []
    while queue:
        path, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        doc = _cell(model.__doc__ or "") if model.__doc__ and model is not Config else ""
        parts.append(f"### `{path}`\n\n*{model.__name__}*{': ' + doc if doc else ''}\n")
        parts.append("| field | type | default | limits | description |")
        parts.append("| --- | --- | --- | --- | --- |")
        for name, info in model.model_fields.items():
            shown = info.alias or name
            parts.append(
                f"| `{shown}` | `{_cell(_type_name(info.annotation))}` | {_default(info)} "
                f"| {_cell(_limits(info))} | {_cell(info.description or '')} |"
            )
            for sub in _submodels(info.annotation):
                if sub not in seen:
                    child = shown if path == "(top level)" else f"{path}.{shown}"
                    queue.append((child, sub))
        parts.append("")
    return "\n".join(parts)


def settings_reference() -> str:
    from fairgate.process.settings import Settings, leaves

    def code(name: str | None) -> str:
        return f"`{name}`" if name else ""

    parts = [
        "| setting | environment | DB setting | config file | default | limits | description |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, info, origin in leaves(Settings):
        parts.append(
            f"| `{name}` | {code(origin.env)} | {code(origin.db)} | {code(origin.file)} "
            f"| {_default(info)} | {_cell(_limits(info))} | {_cell(info.description or '')} |"
        )
    return "\n".join(parts) + "\n"


# -- admin API --------------------------------------------------------------------------------


def _schema_ref(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"list of {_schema_ref(schema.get('items'))}"
    if "anyOf" in schema:
        return " or ".join(_schema_ref(s) for s in schema["anyOf"] if s.get("type") != "null")
    return f"`{schema.get('type', 'object')}`"


def admin_api_reference() -> str:
    from fairgate.admin.api import create_admin_app
    from fairgate.process.state import Gateway

    with tempfile.TemporaryDirectory() as tmp:
        spec = create_admin_app(Gateway(data_dir=Path(tmp), env={})).openapi()
    parts: list[str] = [
        f"Generated from the OpenAPI schema of fairgate {spec['info']['version']} "
        "(served at `/api/openapi.json`). Every route wants `Authorization: Bearer "
        '<FAIRGATE_ADMIN_KEY>`; errors are `{"error": {"message", "type", "fields"}}` '
        "with one entry per refused field.\n"
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((method.upper(), path, op))
    for tag in sorted(by_tag):
        parts.append(f"## {tag.title()}\n")
        for method, path, op in by_tag[tag]:
            parts.append(f"### `{method} /api{path}`\n")
            desc = (op.get("description") or op.get("summary") or "").strip()
            if desc:
                parts.append(desc + "\n")
            params = op.get("parameters") or []
            if params:
                parts.append("| parameter | in | type | required |")
                parts.append("| --- | --- | --- | --- |")
                for p in params:
                    parts.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_ref(p.get('schema'))} "
                        f"| {'yes' if p.get('required') else 'no'} |"
                    )
                parts.append("")
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json")
            if body:
                parts.append(f"Body: {_schema_ref(body.get('schema'))}\n")
            ok = [c for c in op.get("responses", {}) if c.startswith("2")]
            for code in ok:
                content = op["responses"][code].get("content", {}).get("application/json")
                answer = _schema_ref(content.get("schema")) if content else "no body"
                parts.append(f"Answer: `{code}` {answer}\n")
    parts.append("## Schemas\n")
    for name, schema in sorted(spec.get("components", {}).get("schemas", {}).items()):
        props = schema.get("properties")
        if not props:
            continue
        parts.append(f"### `{name}`\n")
        if schema.get("description"):
            parts.append(_cell(schema["description"]) + "\n")
        required = set(schema.get("required", []))
        parts.append("| field | type | required | description |")
        parts.append("| --- | --- | --- | --- |")
        for field, sub in props.items():
            parts.append(
                f"| `{field}` | {_schema_ref(sub)} | {'yes' if field in required else ''} "
                f"| {_cell(sub.get('description', ''))} |"
            )
        parts.append("")
    return "\n".join(parts)


# -- CLI --------------------------------------------------------------------------------------


def _commands(cmd: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Every leaf command under ``cmd`` (Typer ships its own click: duck-typed)."""
    if hasattr(cmd, "list_commands"):
        ctx = typer.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, f"{prefix} {name}")
    else:
        yield prefix, cmd


def cli_reference() -> str:
    from fairgate.cli import app

    root = typer.main.get_command(app)
    parts: list[str] = []
    for name, cmd in _commands(root, "fairgate"):
        parts.append(f"### `{name}`\n")
        if cmd.help:
            parts.append(_cell(cmd.help) + "\n")
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
        usage = " ".join([name, *(a.name.upper() for a in args), "[OPTIONS]" if opts else ""])
        parts.append(f"```\n{usage.strip()}\n```\n")
        rows = [
            (
                f"`{a.name.upper()}`",
                "",
                _cell(getattr(a, "help", "") or ""),
            )
            for a in args
        ]
        for o in opts:
            if o.name == "help":
                continue
            names = ", ".join(f"`{x}`" for x in [*o.opts, *o.secondary_opts])
            env = f" (env `{o.envvar}`)" if isinstance(o.envvar, str) else ""
            default = (
                ""
                if o.is_flag or o.default in (None, "", False) or callable(o.default)
                else f"`{o.default}`"
            )
            rows.append((names, default, _cell((o.help or "") + env)))
        if rows:
            parts.append("| argument / option | default | meaning |")
            parts.append("| --- | --- | --- |")
            parts.extend(f"| {a} | {b} | {c} |" for a, b, c in rows)
            parts.append("")
    return "\n".join(parts)


# -- the hook ---------------------------------------------------------------------------------

MARKERS: dict[str, Callable[[], str]] = {
    "<!-- fairgate:settings-reference -->": settings_reference,
    "<!-- fairgate:config-reference -->": config_reference,
    "<!-- fairgate:admin-api-reference -->": admin_api_reference,
    "<!-- fairgate:cli-reference -->": cli_reference,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
