"""What the admin API's routers share: the Gateway dependency and the error type and bodies.

Every error of the admin API has one shape, ``{"error": {"message", "type", "fields"?}}``, and is
written by us: never a stack trace, a local path or a secret (pydantic's echo of the rejected input
is dropped, since the input may be a secret).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from fairgate.admin.models import ErrorBody, ErrorDetail, ErrorField
from fairgate.process.state import Gateway

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "service_unavailable_error",
}


class AdminError(Exception):
    """Raised by a route; rendered as the error body with its status."""

    def __init__(
        self, status: int, message: str, fields: Sequence[tuple[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = list(fields) if fields is not None else None


def invalid(fields: Sequence[tuple[str, str]], message: str | None = None) -> AdminError:
    """A 422 naming each field, for rules a request model cannot check (references, ...)."""
    summary = message or "; ".join(f"{f}: {m}" if f else m for f, m in fields)
    return AdminError(422, summary, fields)


def error_response(
    status: int,
    message: str,
    fields: Sequence[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(
        error=ErrorDetail(
            message=message,
            type=ERROR_TYPES.get(status, "api_error"),
            fields=None if fields is None else [ErrorField(field=f, message=m) for f, m in fields],
        )
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True), status_code=status, headers=headers
    )


def gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


GW = Annotated[Gateway, Depends(gateway)]

#: Error statuses documented on every route of the OpenAPI schema.
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    s: {"model": ErrorBody} for s in (400, 401, 404, 409, 422, 429)
}
#: Routes that read or reopen the quota store may also answer 503.
STORE_RESPONSES: dict[int | str, dict[str, object]] = {503: {"model": ErrorBody}}
