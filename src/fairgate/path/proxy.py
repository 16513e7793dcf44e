"""The HTTP edge of the request path: ``/v1/chat/completions``, ``/v1/messages``,
``/v1/embeddings``, ``/v1/models``.

Authenticate the key (a hash lookup), parse and check the body once into a
:class:`~fairgate.path.call.Call`, dispatch it (a combo, or a plain model's connections) to
:mod:`fairgate.path.combos`, and render any error in the client's format. What happens
after dispatch, in the request's direction, one job per module: ``pipeline`` (which
candidates, in what order) → ``executor`` (slots, admission, failover, waits) → ``attempt``
(one upstream call) → ``exchange`` (the client route × upstream protocol table) → the
:class:`~fairgate.providers.transport.Upstream` port. Nothing here scans all keys, pools or
connections.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import Response

from fairgate.domain.connections import ANY_MODEL, Connection, Protocol
from fairgate.domain.keys import ClientKey
from fairgate.formats.usage import estimate_prompt_tokens, estimate_text_tokens
from fairgate.path import combos as pipeline
from fairgate.path.bodies import (
    CHAT_FIELDS,
    MAX_CHOICES,
    MAX_MODEL_LEN,
    MAX_OUTPUT_TOKENS,
    MESSAGES_FIELDS,
    RESPONSES_FIELDS,
    check_depth,
    check_fields,
    check_message_limits,
    check_messages,
    decode_json_object,
    optional_bool,
    optional_int,
    read_body,
    require_str,
)
from fairgate.path.call import Call, Route, Services
from fairgate.path.codex_refusal import codex_failed_stream
from fairgate.path.exchange import carried
from fairgate.path.outcome import Outcome
from fairgate.path.render import render
from fairgate.process import tracing
from fairgate.process.client_http import Answer, ClientRequest, answered, error_response
from fairgate.process.errors import ApiError
from fairgate.providers.transport import TRANSPORT_ERRORS
from fairgate.snapshot import Registry

log = logging.getLogger("fairgate.proxy")


# -- entry points --------------------------------------------------------------------------


def _services(request: ClientRequest) -> Services:
    svc: Services = request.app.state.services
    return svc


def now_s(request: ClientRequest) -> int:
    """The gateway's clock in seconds (the injected one in tests): what a translated answer is
    stamped with (``created``, ``created_at``), as the upstream would stamp its own."""
    return _services(request).state.clock.now_ms() // 1000


def _client_secret(request: ClientRequest) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def check_model_allowed(key: ClientKey, model: str) -> None:
    """403 when ``key`` lists the models it may use and ``model`` is not one of them."""
    if key.allowed_models and model not in key.allowed_models:
        raise ApiError(
            403,
            f"This API key may not use model '{model}'",
            code="model_not_allowed",
            param="model",
        )


def resolve_model(svc: Services, key: ClientKey, model: str) -> str:
    """The model a request is served with: its own name, or the target of the alias catching it
    (:meth:`Registry.alias_target`). A key with an allow-list may use an alias when it may use
    the requested name or the target (the admin who made the alias chose the target)."""
    target = svc.state.registry.alias_target(model)
    if target is None:
        check_model_allowed(key, model)
        return model
    if key.allowed_models and model not in key.allowed_models:
        check_model_allowed(key, target)
    return target


def authenticate(svc: Services, request: ClientRequest) -> ClientKey:
    secret = _client_secret(request)
    if secret is None:
        raise ApiError(
            401,
            "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'",
            code="missing_api_key",
        )
    key = svc.state.registry.authenticate(secret)
    if key is None:
        raise ApiError(401, "Invalid API key", code="invalid_api_key")
    svc.state.key_last_used[key.id] = svc.state.clock.now_ms()
    return key


async def chat_completions(request: ClientRequest) -> Response:
    return await _handle(request, Route.CHAT)


async def messages(request: ClientRequest) -> Response:
    return await _handle(request, Route.MESSAGES)


async def embeddings(request: ClientRequest) -> Response:
    return await _handle(request, Route.EMBEDDINGS)


async def responses(request: ClientRequest) -> Response:
    """``POST /v1/responses`` as its own route: relayed as it is to a Responses-wire
    connection, translated to the others per attempt (``exchange``)."""
    return await _handle(request, Route.RESPONSES)


#: Where Anthropic counts a Messages body's input tokens (free; Claude Code's ``/context``).
COUNT_TOKENS_PATH = "/messages/count_tokens"


async def count_tokens(request: ClientRequest) -> Response:
    """``POST /v1/messages/count_tokens``: the input tokens of a Messages body, spending no
    quota (issue 42: Claude Code met a 404, then sent 18 ``max_tokens: 1`` requests, all
    charged to the pool). Authenticated, rate limited and held to the key's models like any
    request; never reserved, settled or counted against a pool. An Anthropic-wire connection
    the key may use for the model counts it (the provider's own tokenizer); failing that, or
    for a model no Anthropic connection serves, the gateway's estimate answers (four
    characters a token, the estimate reservations use; ``x-fairgate-token-count: estimate``),
    which is within about 20 % for English prose and code."""
    svc = _services(request)
    try:
        key = authenticate(svc, request)
        svc.check_rate(key)
        raw = await read_body(request, svc.state.config.server.max_body_bytes)
        body = await asyncio.to_thread(decode_json_object, raw)
        model = require_str(body, "model", max_len=MAX_MODEL_LEN)
        model = resolve_model(svc, key, model)
        check_message_limits(body, svc.limits.max_messages, svc.limits.max_message_bytes)
        check_depth(body)
        check_messages(body)
        counted = await _count_upstream(svc, request, key, body, model)
    except ApiError as err:
        return error_response(err, anthropic=True)
    if counted is not None:
        return Answer(counted, headers={"x-fairgate-token-count": "upstream"})
    tokens = estimate_prompt_tokens(body)
    return Answer(
        orjson.dumps({"input_tokens": tokens}), headers={"x-fairgate-token-count": "estimate"}
    )


async def _count_upstream(
    svc: Services, request: ClientRequest, key: ClientKey, body: dict[str, Any], model: str
) -> bytes | None:
    """The first Anthropic-wire connection's count (the key may use it, the model is its), or
    None. A failure there falls back to the estimate and teaches resilience nothing: a free
    count is no evidence about the account."""
    reg = svc.state.registry
    upstream_model, conns = reg.candidates(model)
    for conn in conns:
        if conn.protocol is not Protocol.ANTHROPIC or reg.denial(key, conn) is not None:
            continue
        payload = orjson.dumps({**body, "model": upstream_model})
        try:
            resp = await svc.upstream.post(conn, COUNT_TOKENS_PATH, payload, request.headers)
        except TRANSPORT_ERRORS:
            continue
        try:
            if resp.status != 200:
                continue
            data = await resp.read()
        except TRANSPORT_ERRORS:
            continue
        finally:
            resp.release()
        try:
            counted = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(counted, dict) and isinstance(counted.get("input_tokens"), int):
            return data
    return None


def _listed_models(reg: Registry, conn: Connection) -> tuple[str, ...]:
    """The models ``/v1/models`` shows for ``conn``: those it names; for a wildcard
    connection (``models: ["*"]``, any model) also its pool's: those the other members name,
    and those asked of its provider's wildcard connections since the configuration was loaded
    (a wildcard has no list of its own to show; ``provider/<any model>`` is served)."""
    if ANY_MODEL not in conn.models:
        return conn.named_models
    pool = reg.pool_by_connection.get(conn.id)
    members = [] if pool is None else [reg.connections.get(cid) for cid in pool.connections]
    named = (m for c in members if c is not None for m in c.named_models)
    asked = reg.wildcard_asked.get(conn.provider, {})
    return tuple(dict.fromkeys((*conn.named_models, *named, *asked)))


async def models(request: ClientRequest) -> Response:
    svc = _services(request)
    try:
        key = authenticate(svc, request)
    except ApiError as err:
        return error_response(err)
    reg = svc.state.registry
    seen: dict[str, str] = {}
    for provider, conns in reg.by_provider.items():
        for conn in conns:
            if reg.denial(key, conn) is not None:
                continue  # only what this key may use
            for m in _listed_models(reg, conn):
                seen.setdefault(f"{provider}/{m}", provider)
                if reg.default_provider == provider:
                    seen.setdefault(m, provider)
    for name in reg.combos:  # user combos; the internal qtSd/ ones are not selectable
        seen.setdefault(name, "fairgate-combo")
    if key.allowed_models:
        seen = {m: p for m, p in seen.items() if m in key.allowed_models}
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": p} for m, p in sorted(seen.items())
    ]
    return Answer(orjson.dumps({"object": "list", "data": data}))


async def chat_from(
    request: ClientRequest, prepare: Callable[[dict[str, Any]], dict[str, Any]]
) -> Response:
    """Serve a request of another client API as a chat completion: ``prepare`` turns its body
    into a chat body (raising ``ApiError`` for what cannot be served), then everything —
    admission, routing, settlement, translation to any upstream — is the chat route's."""
    return await _handle(request, Route.CHAT, prepare)


@tracing.traced("fairgate.request", tracing.request_attrs, tracing.response_attrs, request=True)
async def _handle(
    request: ClientRequest,
    route: Route,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Response:
    svc = _services(request)
    t0 = time.perf_counter()
    key: ClientKey | None = None
    body: dict[str, Any] | None = None
    try:
        key = authenticate(svc, request)
        svc.check_rate(key)
        raw = await read_body(request, svc.state.config.server.max_body_bytes)
        if len(raw) < svc.limits.thread_parse_bytes:
            body = decode_json_object(raw)
            if prepare is not None:
                _before_translation(svc, key, body)
                body = prepare(body)
            call = _parse(svc, request, key, body, route, t0)
        else:  # a large body is parsed and checked off the loop: other requests go on meanwhile
            body = await asyncio.to_thread(decode_json_object, raw)
            if prepare is not None:
                _before_translation(svc, key, body)
                body = await asyncio.to_thread(prepare, body)
            call = await asyncio.to_thread(_parse, svc, request, key, body, route, t0)
        resp = render(await _dispatch(call))
    except ApiError as err:
        if err.diagnostics is not None:  # the client sees reason codes; the admin, all of it
            log.info(
                "request failed",
                extra={"status": err.status, "code": err.code, "diagnostics": err.diagnostics},
            )
        resp = error_response(err, anthropic=route is Route.MESSAGES)
    svc.metrics.observe_request(svc.state.registry, key, body, answered(resp), t0)
    if route is Route.RESPONSES and resp.status_code in (429, 503):
        # a streaming Codex client sees only a refusal's reason in ``response.failed``
        return codex_failed_stream(resp, body, request.headers, now_s(request)) or resp
    return resp


def _before_translation(svc: Services, key: ClientKey, body: dict[str, Any]) -> None:
    """The cheap refusals of :func:`_parse`, on a body of another client API before it is
    translated (issue 43, N15: ``/v1/responses`` translated a whole input before a key that may
    not use the model was refused, three to five times the work of the chat route's refusal):
    the model allow-list, and the item count of ``input`` against the message cap."""
    model = body.get("model")
    if isinstance(model, str):
        resolve_model(svc, key, model)
    items = body.get("input")
    limit = svc.limits.max_messages
    if isinstance(items, list) and len(items) > limit:
        raise ApiError(
            400,
            f"'input' has {len(items)} items; the limit is {limit}",
            param="input",
            code="too_many_messages",
        )


def _parse(
    svc: Services,
    request: ClientRequest,
    key: ClientKey,
    body: dict[str, Any],
    route: Route,
    t0: float,
) -> Call:
    model = require_str(body, "model", max_len=MAX_MODEL_LEN)
    # the cheap refusals first: a key that may not use the model, too many or too large
    # messages; only then the walks over the whole body
    model = resolve_model(svc, key, model)
    limits = svc.limits
    check_message_limits(body, limits.max_messages, limits.max_message_bytes)
    check_depth(body)
    if route is Route.EMBEDDINGS:
        inp = body.get("input")
        if isinstance(inp, str):
            texts = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(x, str) for x in inp):
            texts = list(inp)
        elif isinstance(inp, list) and inp and all(isinstance(x, int) for x in inp):
            texts = ["x" * 4 * len(inp)]  # a token array: ~4 characters a token
        else:
            raise ApiError(400, "'input' must be a string or an array of strings", param="input")
        prompt = sum(estimate_text_tokens(t) for t in texts)
        return Call(svc, request, key, body, route, model, False, prompt, 0, t0, request.headers)
    if route is Route.RESPONSES:
        return _parse_responses(svc, request, key, body, model, t0)
    check_messages(body)
    check_fields(body, MESSAGES_FIELDS if route is Route.MESSAGES else CHAT_FIELDS)
    stream = optional_bool(body, "stream")
    if route is Route.MESSAGES:
        max_out = optional_int(body, "max_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
        if max_out is None:
            raise ApiError(400, "'max_tokens' is required", param="max_tokens")
    else:
        max_cap = optional_int(body, "max_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
        max_out = (
            optional_int(body, "max_completion_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
            or max_cap
        )
    choices = 1
    if route is Route.CHAT:  # n answers, each billed up to the bound (the prompt once)
        choices = optional_int(body, "n", minimum=1, maximum=MAX_CHOICES) or 1
    return _generation(svc, request, key, body, route, model, t0, stream, max_out, choices)


def _generation(
    svc: Services,
    request: ClientRequest,
    key: ClientKey,
    body: dict[str, Any],
    route: Route,
    model: str,
    t0: float,
    stream: bool,
    max_out: int | None,
    choices: int = 1,
) -> Call:
    """The call of a checked chat, messages or Responses body: its prompt estimated from the
    body, its output bounded by the one it names or else the server's default."""
    default_out = svc.state.config.server.default_max_tokens
    return Call(
        svc,
        request,
        key,
        body,
        route,
        model,
        stream,
        estimate_prompt_tokens(body),
        max_out or default_out,
        t0,
        request.headers,
        choices,
    )


def _parse_responses(
    svc: Services,
    request: ClientRequest,
    key: ClientKey,
    body: dict[str, Any],
    model: str,
    t0: float,
) -> Call:
    """A Responses body's wire-neutral checks: what every upstream needs (``input``, the
    output bound, ``stream``) and what none can serve (``previous_response_id``: fairgate
    stores no responses, and the next request may go to another account). What only a
    translation cannot carry is refused per attempt, naming the field."""
    _before_translation(svc, key, body)
    if body.get("previous_response_id") is not None:
        raise ApiError(
            400,
            "'previous_response_id': fairgate does not store responses: send the whole "
            "conversation in `input`",
            param="previous_response_id",
        )
    if "input" not in body:
        raise ApiError(400, "'input' is required", param="input")
    check_fields(body, RESPONSES_FIELDS)
    stream = optional_bool(body, "stream")
    max_out = optional_int(body, "max_output_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
    return _generation(svc, request, key, body, Route.RESPONSES, model, t0, stream, max_out)


# -- admission over candidates -------------------------------------------------------------


async def _dispatch(call: Call) -> Outcome:
    reg = call.svc.state.registry
    combo = reg.combos.get(call.model)
    if combo is not None:
        return await pipeline.route_combo(call, combo)
    if call.model.startswith("qtSd/"):
        raise ApiError(
            400,
            "qtSd/ combos are internal to quota-share routing and not selectable; "
            "ask for the model itself",
            param="model",
        )
    upstream_model, every = reg.candidates(call.model)
    conns = carried(call.route, every)
    if not conns:
        raise ApiError(
            404,
            f"The model '{call.model}' does not exist or has no enabled connection",
            code="model_not_found",
            param="model",
        )
    return await pipeline.route_plain(call, upstream_model, conns)


# -- one attempt on one connection -----------------------------------------------------------


RouteHandler = Callable[[ClientRequest], Any]
