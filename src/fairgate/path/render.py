"""The edge's rendering of the request path's result: an :class:`~fairgate.path.outcome.Outcome`
as the HTTP answer a client gets.

Only here (and in the edge modules that call it, :mod:`fairgate.path.proxy`) does an answer
become HTTP: the ``x-fairgate-*`` headers (who served, the combo, what the translation left
out, the gateway's own time, how a combo raced), the ``x-ratelimit-*`` headers of the admission
it was served under, the content type, and the settlement as the answer's background task (run
once the answer is sent: the client need not wait for the bookkeeping). What goes on the wire is
what the attempt and the combos used to build themselves.
"""

from __future__ import annotations

from starlette.responses import Response

from fairgate.formats.responses_tools import TOOLS_OMITTED_HEADER
from fairgate.formats.wire_loss import OMITTED_HEADER
from fairgate.path.context_fit import COMPRESSED_HEADER
from fairgate.path.outcome import Outcome
from fairgate.path.quota_headers import quota_raw_headers
from fairgate.process.client_http import Answer, Later, StreamAnswer

__all__ = ["render"]


def _headers(outcome: Outcome) -> dict[str, str]:
    headers: dict[str, str] = {}
    if outcome.served_by is not None:
        headers["x-fairgate-connection"] = outcome.served_by
    if outcome.combo:
        headers["x-fairgate-combo"] = outcome.combo
    if outcome.omitted:
        headers[OMITTED_HEADER] = outcome.omitted
    if outcome.tools_omitted:
        headers[TOOLS_OMITTED_HEADER] = outcome.tools_omitted
    if outcome.overhead_ms is not None:
        headers["x-fairgate-overhead-ms"] = f"{outcome.overhead_ms:.3f}"
    if outcome.chunks is not None:
        headers["cache-control"] = "no-cache"
    if outcome.compressed_dropped is not None:
        headers[COMPRESSED_HEADER] = f"dropped={outcome.compressed_dropped}"
    if outcome.hedged:
        headers["x-fairgate-hedged"] = "won"
    if outcome.fan_out is not None:
        headers["x-fairgate-fan-out"] = str(outcome.fan_out)
    return headers


def render(outcome: Outcome) -> Response:
    """The HTTP answer of ``outcome``: a stream, a whole event stream, or a JSON answer whose
    settlement runs after it is sent."""
    headers = _headers(outcome)
    resp: Response
    if outcome.chunks is not None:
        resp = StreamAnswer(
            outcome.chunks,
            headers,
            served_by=outcome.served_by,
            overhead_ms=outcome.overhead_ms,
        )
    elif outcome.sse:  # a composed answer to a streaming request: one whole event stream
        resp = Response(outcome.body, media_type="text/event-stream", headers=headers)
    else:
        # the settlement moves to the answer's background task (the outcome keeps none, so it
        # still runs exactly once), called directly: no coroutine of the outcome's around it
        pending, outcome.pending = outcome.pending, None
        resp = Answer(
            outcome.body,
            headers=headers,
            background=None if pending is None else Later(pending),
            served_by=outcome.served_by,
            overhead_ms=outcome.overhead_ms,
        )
    if outcome.admission is not None:
        resp.raw_headers.extend(quota_raw_headers(outcome.admission))
    return resp
