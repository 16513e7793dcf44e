"""How to install an optional part of fairgate (an "extra": ``otel``, ``sim``).

fairgate is installed from its repository, not from a package index, where a ``pip install`` of
the name finds nothing: the hint a message gives names the install that works, from the
checkout into the environment fairgate runs from (``make demo``'s ``.venv``, or a service's
own, docs/deploy.md).
"""

from __future__ import annotations

__all__ = ["extra_hint"]


def extra_hint(extra: str) -> str:
    """The command that installs ``extra``, for a message that says it is missing."""
    return f"pip install -e '.[{extra}]' in the fairgate checkout"
