"""``python -m fairgate`` is the ``fairgate`` command."""

from __future__ import annotations

from fairgate.cli import main

main()
