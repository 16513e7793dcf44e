"""Does the request explain its own failure? (issue 43, N3). Pure: numbers in, a verdict out.

A provider-wide breaker and a connection cooldown act for every tenant, so they must learn only
from what says something about the provider. Some failures a tenant can cause on purpose, and
they say nothing about the provider:

- a **timeout** of a request whose output bound could need that long: 4 000 tokens do not come
  in 3 s (``upstream_timeout_s: 3``), so six parallel ``max_tokens: 4000`` requests time out
  whatever the provider's health;
- a **5xx answer on a large request** (its size or content may have provoked it);
- a **5xx or a broken connection after the request ran long**: the upstream cut a long
  generation, or a stream the client stalled until the upstream gave up.

Those are *explained* by the request: they fail that request and set nothing on the
connection, and they count toward the breaker only when another client key witnesses a failure
too (``manager.py``). What no request explains stays provider evidence on its own: a connection
refused or lost at once, a quick 5xx on a small request, a timeout of a request whose bound a
healthy provider writes well within the time.

The thresholds are deliberately generous to the provider (a slow but healthy one writes
:data:`MIN_TOKENS_PER_S`); a misjudged failure only needs a second key's witness to count.
"""

from __future__ import annotations

from typing import Final

from fairgate.resilience.classify import Classification, FailureClass

__all__ = [
    "LARGE_OUTPUT_TOKENS",
    "LARGE_PROMPT_TOKENS",
    "MIN_TOKENS_PER_S",
    "SLOW_FAILURE_MS",
    "request_explains",
]

#: Output tokens a second that even a slow, healthy provider writes: a timeout after ``t``
#: seconds is explained by a request whose output bound is at least ``t`` times this.
MIN_TOKENS_PER_S: Final = 20
#: An output bound from here on makes a request large (a 5xx on it may be the request's).
LARGE_OUTPUT_TOKENS: Final = 1_024
#: A prompt from here on makes a request large.
LARGE_PROMPT_TOKENS: Final = 32_000
#: A 5xx or a lost connection this long after the send: the request ran long enough to explain
#: it (the upstream cut a long generation, or a stream the client had stalled).
SLOW_FAILURE_MS: Final = 10_000


def request_explains(
    verdict: Classification,
    *,
    answered: bool,
    output_bound: int,
    prompt_tokens: int,
    elapsed_ms: int,
) -> bool:
    """True when the request's own size or duration accounts for this failure (module
    docstring). ``answered``: the upstream sent an error status (not a lost connection);
    ``output_bound``: the output tokens the request allowed (every choice); ``elapsed_ms``:
    from the send to the failure, on the injected clock. Only provider-looking failures
    (server errors, timeouts) are judged; anything else is no provider evidence anyway."""
    if not verdict.provider_failure:
        return False
    if verdict.cls is FailureClass.TIMEOUT:  # could the bound need that long? (size alone
        # is no excuse: 4 000 tokens are written well within the default 600 s)
        return output_bound * 1000 >= elapsed_ms * MIN_TOKENS_PER_S
    if verdict.cls is FailureClass.SERVER_ERROR:
        large = output_bound >= LARGE_OUTPUT_TOKENS or prompt_tokens >= LARGE_PROMPT_TOKENS
        return elapsed_ms >= SLOW_FAILURE_MS or (answered and large)
    return False
