"""The built-in mock LLM provider (``fairgate mock-upstream``, and ``fairgate demo``'s upstream).

A real aiohttp server that speaks the OpenAI chat, Anthropic messages and Responses (Codex)
wires as the providers document them: usage, errors, rate-limit headers, tool calls, thinking,
OAuth token refresh (``oauth``), Codex's 5-hour and weekly windows (``codex``), and a fault
language scripted per request (``faults``). The gateway's own code never imports it: it is the
upstream, not part of the gateway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.mock.server import MockConfig, MockUpstream, run_mock_upstream
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["MockConfig", "MockUpstream", "run_mock_upstream"]
