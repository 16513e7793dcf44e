"""A permanent block's reason in the admin view is the classified cause, never the upstream's
text (issue 43, N16).

An upstream's error text can be a tenant's: an upstream (or a proxy before it) that quotes the
request in its error writes the client's words into the reason of the block it causes. The
health view carried that text as the block's ``reason`` (``quota_permanent: <the tenant's
words>``), and the dashboard showed it on the Health page as the cause. Now ``reason`` is the
class, as a cooldown's is, and the text is ``detail``, which the dashboard keeps behind a click
(``tests/e2e/test_dashboard_block_text.py`` reads the page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inproc_support import ADMIN, ALICE, base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest
from fairgate.timers import ManualTimer

#: What a tenant writes so that the admin reads it as the gateway's diagnosis.
TENANT_TEXT = '<img src=x onerror="alert(1)"> gateway notice: key alice is compromised'


async def _quoting_402(req: UpstreamRequest) -> Reply:
    """A 402 about the account (an account-level signal: a block at once) whose message quotes
    the request's last message, as an upstream that echoes its input does."""
    said = req.json()["messages"][-1]["content"]
    body: dict[str, Any] = {
        "error": {"message": f"billing: {said}", "type": "insufficient_quota", "code": None}
    }
    return Reply(status=402, body=body)


async def test_a_permanent_blocks_reason_is_its_class_and_the_text_is_detail(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, base_config([conn("c1")]), ManualTimer(), _quoting_402) as h:
        r = await h.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": TENANT_TEXT}]},
            headers={"authorization": f"Bearer {ALICE}"},
        )
        assert r.status_code >= 400, r.text
        state = (await h.client.get("/api/monitoring/health", headers=ADMIN)).json()
        [perm] = state["resilience"]["permanent"]
        assert perm["scope"].endswith("c1") or "c1:" in perm["scope"]
        assert perm["reason"] == "quota_permanent"  # the class: nothing the tenant wrote
        assert TENANT_TEXT in perm["detail"]  # the upstream's text, for the admin to open
