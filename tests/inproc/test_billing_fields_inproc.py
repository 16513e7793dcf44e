"""Billing-relevant body fields reach a shared account only where its connection allows them
(issue 43, N13).

``service_tier: priority`` bills the shared account at the priority rate, ``store: true`` keeps
the tenant's completion on it; both were forwarded as sent on chat completions (and
``service_tier`` on Anthropic messages). A connection now lists the ones clients may set
(``billing_fields``, config and admin API, a DB column); the others are removed before
sending, so the account's own defaults apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inproc_support import ADMIN, ALICE, base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, anthropic_message, openai_chat
from fairgate.timers import ManualTimer

BILLED = {"service_tier": "priority", "store": True}


class Recorder:
    """The upstream: answers in the connection's wire and keeps every body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, req: UpstreamRequest) -> Reply:
        self.bodies.append(req.json())
        return anthropic_message("hi") if req.path == "/messages" else openai_chat("hi")


def _config(**billing: list[str]) -> dict[str, Any]:
    return base_config(
        [
            conn("open-1", models=("m",), **billing),
            conn("claude-1", "anthropic", models=("claude",)),
        ]
    )


async def test_billing_fields_are_removed_unless_the_connection_allows_them(
    tmp_path: Path,
) -> None:
    up = Recorder()
    async with gateway(tmp_path, _config(), ManualTimer(), up) as h:
        r = await h.chat("m", max_tokens=5, **BILLED)
        assert r.status_code == 200, r.text
        sent = up.bodies[-1]
        assert "service_tier" not in sent  # the account's defaults
        assert "store" not in sent
        assert sent["max_tokens"] == 5  # the rest as sent
        r = await h.client.post(
            "/v1/messages",
            json={
                "model": "claude",
                "max_tokens": 5,
                "service_tier": "auto",
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"x-api-key": ALICE},
        )
        assert r.status_code == 200, r.text
        assert "service_tier" not in up.bodies[-1]


async def test_a_connection_that_lists_a_field_passes_it(tmp_path: Path) -> None:
    up = Recorder()
    cfg = _config(billing_fields=["service_tier"])
    async with gateway(tmp_path, cfg, ManualTimer(), up) as h:
        r = await h.chat("m", max_tokens=5, **BILLED)
        assert r.status_code == 200, r.text
        assert up.bodies[-1]["service_tier"] == "priority"
        assert "store" not in up.bodies[-1]  # not listed: removed
        got = (await h.client.get("/api/connections/open-1", headers=ADMIN)).json()
        assert got["billingFields"] == ["service_tier"]


async def test_the_admin_api_sets_the_policy_and_it_is_kept(tmp_path: Path) -> None:
    up = Recorder()
    async with gateway(tmp_path, _config(), ManualTimer(), up) as h:
        bad = await h.client.patch(
            "/api/connections/open-1", json={"billingFields": ["temperature"]}, headers=ADMIN
        )
        assert bad.status_code == 422, bad.text
        assert "billingFields" in bad.text
        ok = await h.client.patch(
            "/api/connections/open-1", json={"billingFields": ["store"]}, headers=ADMIN
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["billingFields"] == ["store"]
        r = await h.chat("m", max_tokens=5, **BILLED)
        assert r.status_code == 200, r.text
        assert up.bodies[-1]["store"] is True
        assert "service_tier" not in up.bodies[-1]
    async with gateway(tmp_path, _config(), ManualTimer(), up) as again:  # from the DB column
        r = await again.chat("m", max_tokens=5, **BILLED)
        assert r.status_code == 200, r.text
        assert up.bodies[-1]["store"] is True
