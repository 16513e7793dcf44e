"""Reading and checking a request body once, with a size limit and field-naming errors."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from fairgate.server.errors import ApiError


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object. Over ``max_bytes`` → 413 (checked on Content-Length first, then
    while reading, so a lying or absent header cannot make us buffer more than the limit)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise _too_large(max_bytes)
        except ValueError:
            raise ApiError(400, "Invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise ApiError(400, "Request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(400, "Request body is not valid JSON (or not UTF-8)") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    return body


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"Request body exceeds the limit of {max_bytes} bytes", code="request_too_large"
    )


def require_str(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, f"'{field}' is required and must be a non-empty string", param=field)
    return value


def require_list(body: dict[str, Any], field: str, *, allow_empty: bool = False) -> list[Any]:
    value = body.get(field)
    if not isinstance(value, list) or (not allow_empty and not value):
        raise ApiError(400, f"'{field}' is required and must be a non-empty array", param=field)
    return value


def optional_int(body: dict[str, Any], field: str, *, minimum: int = 0) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"'{field}' must be an integer ≥ {minimum}", param=field)
    return value


def optional_bool(body: dict[str, Any], field: str) -> bool:
    value = body.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{field}' must be a boolean", param=field)
    return value
