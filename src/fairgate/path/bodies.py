"""Reading and checking a request body once, with a size limit and field-naming errors."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from fairgate.process.client_request import ClientRequest
from fairgate.process.errors import ApiError

log = logging.getLogger("fairgate.proxy")


async def read_body(request: ClientRequest, max_bytes: int) -> bytes:
    """The raw body. Over ``max_bytes`` → 413 (checked on Content-Length first, then while
    reading, so a lying or absent header cannot make us buffer more than the limit). A client
    that hangs up mid-body is no error of ours: a debug line and a 499 nobody receives. Read
    from ASGI ``receive`` directly: a body that arrives in one message (most do) is returned
    as it came, without a copy."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise _too_large(max_bytes)
        except ValueError:
            raise ApiError(400, "Invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            if not message.get("more_body", False):
                if not chunks:
                    return chunk
                chunks.append(chunk)
                return b"".join(chunks)
            if chunk:
                chunks.append(chunk)
        elif kind == "http.disconnect":
            log.debug("client disconnected while sending its body", extra={"received": size})
            raise ApiError(499, "Client closed the request", code="client_closed")


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object (400 naming the problem otherwise). One C-speed pass: nesting
    depth is checked later (:func:`check_depth`), after the cheap refusals."""
    if not raw.strip():
        raise ApiError(400, "Request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _not_json(str(exc)) from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    return body


#: Deepest nesting of arrays and objects accepted in a body. The body is re-encoded for the
#: upstream (orjson refuses to encode more than 254 levels), and no real request comes close.
MAX_DEPTH = 128


def _not_json(reason: str) -> ApiError:
    """A clear 400 for a body the parser refused (its reason names a position, never the input:
    the body may hold secrets)."""
    if "depth limit" in reason:
        return _too_deep()
    if "UTF-8" in reason:
        return ApiError(400, "Request body is not valid UTF-8")
    return ApiError(400, f"Request body is not valid JSON ({reason})")


def _too_deep() -> ApiError:
    return ApiError(400, f"Request body nests arrays or objects deeper than {MAX_DEPTH} levels")


_CONTAINERS = (dict, list)


def check_depth(body: object) -> None:
    """400 when ``body`` nests deeper than :data:`MAX_DEPTH` (iterative: no recursion limit).
    Only arrays and objects are stacked, each with its depth, in plain loops (this walks the
    whole body of every request)."""
    stack: list[tuple[object, int]] = [(body, 1)]
    push, pop = stack.append, stack.pop
    while stack:
        value, depth = pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        children: Iterable[object]
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:  # the body itself, when it is no container (only containers are stacked)
            continue
        inner = depth + 1
        for v in children:
            if isinstance(v, _CONTAINERS):
                push((v, inner))


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"Request body exceeds the limit of {max_bytes} bytes", code="request_too_large"
    )


def require_str(body: dict[str, Any], field: str, *, max_len: int | None = None) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, f"'{field}' is required and must be a non-empty string", param=field)
    if max_len is not None and len(value) > max_len:
        raise ApiError(400, f"'{field}' is longer than {max_len} characters", param=field)
    return value


def require_list(body: dict[str, Any], field: str, *, allow_empty: bool = False) -> list[Any]:
    value = body.get(field)
    if not isinstance(value, list) or (not allow_empty and not value):
        raise ApiError(400, f"'{field}' is required and must be a non-empty array", param=field)
    return value


def optional_int(
    body: dict[str, Any], field: str, *, minimum: int = 0, maximum: int | None = None
) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f"≥ {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ApiError(400, f"'{field}' must be an integer {bound}", param=field)
    return value


def optional_bool(body: dict[str, Any], field: str) -> bool:
    value = body.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{field}' must be a boolean", param=field)
    return value


# -- the standard fields of the OpenAI and Anthropic request bodies ---------------------------
#
# The gateway re-encodes the body for the upstream and reserves quota before it sends it, so a
# request whose standard fields have the wrong type is refused here (400 naming the field)
# rather than spending a reservation and an upstream round trip on a certain upstream 400 -- or,
# worse, an upstream that ignores the field and answers 200 with something the client did not
# ask for. Only fields that are present are checked; unknown fields pass through untouched.

#: Largest ``max_tokens`` accepted: far above any model's output limit, small enough that the
#: reservation it sizes stays meaningful (a 1e18-token reservation is a malformed request, not
#: a reason to answer "the pool is saturated").
MAX_OUTPUT_TOKENS = 10_000_000

#: Most answers one chat request may ask for (``n``; OpenAI's own bound): each is billed.
MAX_CHOICES = 128

#: The longest model name accepted (as the config file's model names).
MAX_MODEL_LEN = 200


#: The Python type of each JSON kind as the parser makes it (``number`` also takes an integer).
_KIND_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True, slots=True)
class FieldRule:
    """The JSON types a field may take (``null`` means it may be null) and a numeric range.

    ``plain``: the exact types a value may have to be accepted without a look at its range
    (numbers with a range are not among them), so the usual value is accepted by one set
    lookup; anything else goes through :meth:`problem`, which has the final word."""

    kinds: frozenset[str]
    lo: float | None = None
    hi: float | None = None
    plain: frozenset[type] = frozenset()

    def accepts(self, value: object) -> bool:
        return type(value) in self.plain or self.problem(value) is None

    def problem(self, value: object) -> str | None:
        kind = json_kind(value)
        ok = kind in self.kinds or (kind == "integer" and "number" in self.kinds)
        if not ok:
            names = [n for k, n in _NAMES.items() if k in self.kinds]
            listed = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
            return "must be " + listed
        if not isinstance(value, (int, float)) or isinstance(value, bool):  # no union per call
            return None
        if self.lo is not None and value < self.lo:
            return f"must be ≥ {self.lo:g}" if self.hi is None else self._range()
        if self.hi is not None and value > self.hi:
            return f"must be ≤ {self.hi:g}" if self.lo is None else self._range()
        return None

    def _range(self) -> str:
        return f"must be between {self.lo:g} and {self.hi:g}"


_NAMES = {  # in the order error messages list them
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _rule(*kinds: str, lo: float | None = None, hi: float | None = None) -> FieldRule:
    plain = {t for k in kinds for t in _KIND_TYPES[k]}
    if lo is not None or hi is not None:
        plain -= {int, float}  # a number in range is for problem() to say
    return FieldRule(frozenset(kinds), lo, hi, frozenset(plain))


_MESSAGE_FIELDS: dict[str, FieldRule] = {
    "content": _rule("string", "array", "null"),
    "name": _rule("string", "null"),
    "tool_calls": _rule("array", "null"),
    "tool_call_id": _rule("string", "null"),
}

#: OpenAI chat completions (``/v1/chat/completions``).
CHAT_FIELDS: dict[str, FieldRule] = {
    "stream_options": _rule("object", "null"),
    "n": _rule("integer", "null", lo=1, hi=MAX_CHOICES),
    "temperature": _rule("number", "null", lo=0, hi=2),
    "top_p": _rule("number", "null", lo=0, hi=1),
    "presence_penalty": _rule("number", "null", lo=-2, hi=2),
    "frequency_penalty": _rule("number", "null", lo=-2, hi=2),
    "stop": _rule("string", "array", "null"),
    "logit_bias": _rule("object", "null"),
    "logprobs": _rule("boolean", "null"),
    "top_logprobs": _rule("integer", "null", lo=0, hi=20),
    "user": _rule("string", "null"),
    "seed": _rule("integer", "null"),
    "tools": _rule("array", "null"),
    "tool_choice": _rule("string", "object", "null"),
    "parallel_tool_calls": _rule("boolean", "null"),
    "response_format": _rule("object", "null"),
    "metadata": _rule("object", "null"),
    "store": _rule("boolean", "null"),
    "reasoning_effort": _rule("string", "null"),
    "modalities": _rule("array", "null"),
    "service_tier": _rule("string", "null"),
    "functions": _rule("array", "null"),
    "function_call": _rule("string", "object", "null"),
}

#: Anthropic messages (``/v1/messages``).
MESSAGES_FIELDS: dict[str, FieldRule] = {
    "system": _rule("string", "array", "null"),
    "stop_sequences": _rule("array", "null"),
    "temperature": _rule("number", "null", lo=0, hi=1),
    "top_p": _rule("number", "null", lo=0, hi=1),
    "top_k": _rule("integer", "null", lo=0),
    "tools": _rule("array", "null"),
    "tool_choice": _rule("object", "null"),
    "metadata": _rule("object", "null"),
    "thinking": _rule("object", "null"),
}

#: The OpenAI Responses API (``/v1/responses``): its standard fields' types and ranges, what
#: every upstream wire would refuse alike (checked before any is chosen).
RESPONSES_FIELDS: dict[str, FieldRule] = {
    "input": _rule("string", "array"),
    "instructions": _rule("string", "array", "null"),
    "temperature": _rule("number", "null", lo=0, hi=2),
    "top_p": _rule("number", "null", lo=0, hi=1),
    "tools": _rule("array", "null"),
    "tool_choice": _rule("string", "object", "null"),
    "parallel_tool_calls": _rule("boolean", "null"),
    "text": _rule("object", "null"),
    "reasoning": _rule("object", "null"),
    "include": _rule("array", "null"),
    "metadata": _rule("object", "null"),
    "store": _rule("boolean", "null"),
    "prompt_cache_key": _rule("string", "null"),
    "service_tier": _rule("string", "null"),
    "user": _rule("string", "null"),
    "safety_identifier": _rule("string", "null"),
}


def check_fields(body: dict[str, Any], rules: dict[str, FieldRule]) -> None:
    """400 naming the first standard field of ``body`` (in the order of ``rules``) whose type or
    range is wrong. The body's own fields are looked at first (a request sends a few of the
    many standard fields); only when one is wrong are the rules walked in order, so that the
    error names the same field whatever order the client sent them in."""
    for name, value in body.items():
        rule = rules.get(name)
        if rule is not None and not rule.accepts(value):
            break
    else:
        return
    for name, rule in rules.items():
        if name in body:
            problem = rule.problem(body[name])
            if problem is not None:
                raise ApiError(400, f"'{name}' {problem}", param=name)


def check_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``messages``: a non-empty array of objects with a string ``role``, content a string, an
    array of typed parts (objects with a string ``type``) or null."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(
            400, "'messages' is required and must be a non-empty array", param="messages"
        )
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            where = f"messages[{i}]"
            raise ApiError(400, f"'{where}' must be an object with a string 'role'", param=where)
        for name, rule in _MESSAGE_FIELDS.items():
            if name in m and not rule.accepts(m[name]):
                problem = rule.problem(m[name])
                where = f"messages[{i}].{name}"
                raise ApiError(400, f"'{where}' {problem}", param=where)
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    param = f"messages[{i}].content[{j}]"
                    raise ApiError(
                        400, f"'{param}' must be an object with a string 'type'", param=param
                    )
    return msgs


def check_message_limits(body: dict[str, Any], max_messages: int, max_message_bytes: int) -> None:
    """400 naming the field when ``messages`` holds more than ``max_messages`` entries or one
    whose content is larger than ``max_message_bytes`` (string content counts characters, an
    array of parts its JSON size). Runs before the per-message checks: O(1) for the count, one
    C-speed encode per array content."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return
    if len(msgs) > max_messages:
        raise ApiError(
            400,
            f"'messages' has {len(msgs)} entries; the limit is {max_messages}",
            param="messages",
            code="too_many_messages",
        )
    for i, m in enumerate(msgs):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            size = len(content)
        elif isinstance(content, list):
            try:
                size = len(orjson.dumps(content))
            except TypeError:  # nested too deep to encode: check_depth names it
                continue
        else:
            continue
        if size > max_message_bytes:
            param = f"messages[{i}].content"
            raise ApiError(
                400,
                f"'{param}' is larger than the limit of {max_message_bytes} bytes",
                param=param,
                code="message_too_large",
            )
