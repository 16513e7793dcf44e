"""A combo's ``responseValidation`` (issue 46): checks of a 200 beyond the empty/truncated ones.

Two checks, each off until the combo asks for it: the answer's text must match none of the
combo's ``disallowedPatterns``, and with ``jsonSchema: true`` an answer to a request that named a
JSON schema (``response_format: {type: json_schema}`` on chat, ``text.format`` on Responses,
which reaches the request path as chat's ``response_format``) must be JSON valid against it,
checked by the ``jsonschema`` library. A failed check is a reason the executor fails over, as
for a provider error; the problem text goes to the diagnostics, never the answer itself.

Pure functions of the rules, the request and the parsed answer: the request path calls
:func:`validation_problem` once per answered attempt, O(answer) work.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jsonschema
import orjson
from jsonschema.exceptions import SchemaError

from fairgate.path.call import Route
from fairgate.routing.model import ResponseValidation

__all__ = ["answer_text", "requested_schema", "validation_problem"]


def answer_text(route: Route, answer: Mapping[str, Any]) -> str:
    """The text the client reads in a non-stream answer (chat's first choice, a message's text
    blocks); empty when there is none (a tool call only)."""
    if route is Route.MESSAGES:
        blocks = answer.get("content") or []
        return "".join(
            str(b.get("text") or "")
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text"
        )
    choices = answer.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    msg = choices[0].get("message") or {}
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, str) else ""


def requested_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON schema a request asked the answer to follow, if any: chat's
    ``response_format.json_schema.schema`` or Responses' ``text.format.schema``."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        return schema if isinstance(schema, dict) else None
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return schema if isinstance(schema, dict) else None
    return None


@functools.lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Any:
    """A validator per distinct schema (a client sends the same one again and again); None
    for a schema that is itself invalid (the client's mistake: not the answer's)."""
    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)


def validation_problem(
    rules: ResponseValidation, route: Route, request: Mapping[str, Any], answer: Mapping[str, Any]
) -> str | None:
    """Why an answer fails the combo's checks (a short text for the diagnostics), or None."""
    if not rules.active or route is Route.EMBEDDINGS:
        return None
    text = answer_text(route, answer)
    for i, pattern in enumerate(rules.disallowed_patterns):
        if pattern.search(text):
            return f"response validation: disallowed pattern {i} matched"
    if rules.json_schema:
        schema = requested_schema(request)
        if schema is None:
            return None
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
        if validator is None:
            return None
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return "response validation: the answer is not the JSON its schema asks for"
        error = next(iter(validator.iter_errors(value)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return f"response validation: schema violated at {where} ({error.validator})"
    return None
