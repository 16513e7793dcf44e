"""``POST /v1/responses``: the OpenAI Responses API for clients, a client route of its own.

A request is admitted, routed and settled like any other; per attempt the exchange table
(:mod:`fairgate.path.exchange`) relays it as it is to a Responses-wire connection (the
Codex backend, ``protocol: responses``: every field and event the gateway does not need to
change arrives unchanged, issue 42) and translates it through the chat form to an OpenAI chat
or Anthropic connection (:mod:`fairgate.formats.responses`), refusing with a 400 naming the
field what that wire cannot carry. Fusion and pipeline combos, which compose chat answers, are
served through the chat route (:mod:`fairgate.path.responses_chat`). Errors keep the OpenAI
error body, which is what Responses clients read too.

Decided here: ``previous_response_id`` is a 400 naming the field: fairgate stores no
responses, and the next request may go to another account, so clients send the whole
conversation (as ``store: false`` clients do); ``store`` is false unless the client says
otherwise.
"""

from __future__ import annotations

from starlette.responses import Response

from fairgate.path import proxy
from fairgate.process.client_request import ClientRequest

__all__ = ["responses"]


async def responses(request: ClientRequest) -> Response:
    return await proxy.responses(request)
