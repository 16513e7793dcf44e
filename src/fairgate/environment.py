"""The one reader of the process environment.

Settings come from the environment once, at start: the CLI takes one :func:`snapshot` when a
command starts and passes it down to every area's settings reader (``QuotaSettings``,
``ResilienceSettings``, ``HttpSettings``, the store and database choices, logging, tracing), each
of which takes a plain mapping and never looks at ``os.environ`` itself. So a test builds any
configuration from a dict, and nothing changes under a running gateway when someone edits the
environment. ``tests/unit/test_environment_reads.py`` keeps every other module off
``os.environ``.

The defaults of constructors that take an ``env`` (``Gateway``, ``load_config_text``,
``open_store``, ``configure_logging``) call :func:`snapshot` too, for programs that embed
fairgate without its CLI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType


def snapshot() -> Mapping[str, str]:
    """A read-only copy of the environment as it is now."""
    return MappingProxyType(dict(os.environ))


def export(name: str, value: str) -> None:
    """Set a variable for the processes this one starts (``serve --workers``: the supervisor
    hands each worker its spec this way, since uvicorn starts workers with the environment)."""
    os.environ[name] = value


def unset(name: str) -> None:
    """Remove a variable :func:`export` set, once the processes that needed it are gone."""
    os.environ.pop(name, None)
