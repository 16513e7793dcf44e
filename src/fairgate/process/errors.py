"""Error bodies clients' SDKs understand: OpenAI format on the OpenAI routes, Anthropic format on
``/v1/messages``. Always JSON, always sanitized: a message we wrote, never a stack trace, a local
path, a secret, or a connection or pool id (those are for admins: logs and the admin API).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.resilience.failover import Step

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """Raised anywhere in request handling; rendered at the edge by
    :func:`fairgate.process.client_http.error_response` (this module is plain data: the request
    path below its edge raises it without importing an HTTP framework)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type_: str | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        diagnostics: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        #: the admin's view (logged), and the client's (in the body): see server.diagnostics
        self.diagnostics = dict(diagnostics) if diagnostics is not None else None
        self.client_diagnostics: dict[str, Any] | None = None
        #: True when trying another target cannot help (the request itself is at fault)
        self.final = False
        #: what the failover rule says after the attempt that produced it (None: not an
        #: attempt's error)
        self.step: Step | None = None
        #: the same upstream model elsewhere would fail alike (a context overflow)
        self.same_model_futile = False
        #: the failure class of the attempt that produced it (``server_error``, ``rate_limit``…)
        self.failure: str | None = None
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or _TYPES.get(status, "api_error")
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})


def openai_error_body(err: ApiError) -> dict[str, Any]:
    body: dict[str, Any] = {
        "message": err.message,
        "type": err.type,
        "param": err.param,
        "code": err.code,
    }
    body.update(err.extra)
    return {"error": body}


def anthropic_error_body(err: ApiError) -> dict[str, Any]:
    """Anthropic's error shape. A 429 or 503 with a ``Retry-After`` in seconds says the wait in
    its message too: Claude Code prints an error's message ("API Error: Request rejected (429) ·
    <message>") but not its headers, and a user refused by the quota share should learn when to
    come back (issue 42, item 7)."""
    message = err.message
    retry = err.headers.get("Retry-After") or err.headers.get("retry-after")
    if err.status in (429, 503) and retry is not None and retry.isdigit():
        message = f"{message}; retry in {retry} s"
    inner: dict[str, Any] = {"type": err.type, "message": message}
    if err.code:
        inner["code"] = err.code
    inner.update(err.extra)
    return {"type": "error", "error": inner}
