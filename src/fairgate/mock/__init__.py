"""The built-in mock LLM provider (``fairgate mock-upstream``, and ``fairgate demo``'s upstream).

A real aiohttp server that speaks the OpenAI chat, Anthropic messages and Responses (Codex)
wires as the providers document them: usage, errors, rate-limit headers, tool calls, thinking,
OAuth token refresh (``oauth``), Codex's 5-hour and weekly windows (``codex``), and a fault
language scripted per request (``faults``). The gateway's own code never imports it: it is the
upstream, not part of the gateway.
"""
