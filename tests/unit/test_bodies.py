"""The body checks' quick paths (``path/bodies.py``): a field's rule accepts exactly what its
full check accepts, the first wrong field in the rules' order is named whatever order the client
sent them in, and the depth walk refuses exactly past ``MAX_DEPTH``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgate.path.bodies import (
    CHAT_FIELDS,
    MAX_DEPTH,
    MESSAGES_FIELDS,
    check_depth,
    check_fields,
    check_messages,
)
from fairgate.process.errors import ApiError

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
    st.text(max_size=5),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
RULES = [*CHAT_FIELDS.values(), *MESSAGES_FIELDS.values()]


@given(value=JSON_VALUES)
def test_a_rule_accepts_exactly_what_its_full_check_accepts(value: Any) -> None:
    for rule in RULES:
        assert rule.accepts(value) == (rule.problem(value) is None)


@given(fields=st.dictionaries(st.sampled_from(sorted(CHAT_FIELDS)), JSON_VALUES, max_size=6))
def test_the_first_wrong_field_in_rule_order_is_named_in_any_body_order(
    fields: dict[str, Any],
) -> None:
    expected = next(
        (n for n, rule in CHAT_FIELDS.items() if n in fields and rule.problem(fields[n])), None
    )
    for body in (fields, dict(reversed(list(fields.items())))):
        if expected is None:
            check_fields(body, CHAT_FIELDS)
            continue
        with pytest.raises(ApiError) as err:
            check_fields(body, CHAT_FIELDS)
        assert err.value.param == expected


def test_a_message_field_of_the_wrong_type_is_named_with_its_index() -> None:
    body = {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "name": 3}]}
    with pytest.raises(ApiError) as err:
        check_messages(body)
    assert err.value.param == "messages[1].name"
    assert str(err.value) == "'messages[1].name' must be a string or null"


def _nested(levels: int) -> dict[str, Any]:
    """A body whose innermost container is ``levels`` deep (the body itself is level 1)."""
    inner: Any = "leaf"
    for i in range(levels - 1):
        inner = [inner] if i % 2 else {"k": inner}
    return {"messages": inner} if levels > 1 else {"x": 1}


@pytest.mark.parametrize("levels", [1, 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_nesting_up_to_the_limit_passes(levels: int) -> None:
    check_depth(_nested(levels))


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, MAX_DEPTH + 20])
def test_nesting_past_the_limit_is_refused(levels: int) -> None:
    with pytest.raises(ApiError) as err:
        check_depth(_nested(levels))
    assert err.value.status == 400
