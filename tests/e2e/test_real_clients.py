"""The real Claude Code and Codex CLI, pinned and installed by ``scripts/ensure_clients.sh``, run
against ``fairgate serve`` over the mock upstream (issue 42, item 1).

Each client runs with a private HOME (and CODEX_HOME), telemetry and updates off, and only the
gateway's address and a client key configured. Covered: a plain prompt with the client's DEFAULT
model (the gateway's model aliases catch it), a tool loop (the mock answers with a scripted tool
call, the client runs it and sends the result back) in front of each upstream wire (Anthropic,
OpenAI chat, Responses), and a quota block (what the client prints). Without the clients these
tests skip locally; under ``CI`` they fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import FAULTS, UPSTREAM_SECRET, Proc, module_gateway

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = Path(os.environ.get("FAIRGATE_TEST_CLIENTS_DIR") or ROOT / ".cache" / "clients")
BIN = CLIENTS / "node_modules" / ".bin"


def _pinned(name: str) -> str:
    """A pinned version, read from the install script (one place for it)."""
    text = (ROOT / "scripts" / "ensure_clients.sh").read_text()
    m = re.search(rf'^{name}="([^"]+)"', text, re.MULTILINE)
    assert m is not None, name
    return m.group(1)


CLAUDE_VERSION = _pinned("CLAUDE_CODE_VERSION")
CODEX_VERSION = _pinned("CODEX_VERSION")
KEY = "fg-test-real-clients-key-000000000001"
BLOCKED_KEY = "fg-test-real-clients-key-000000000002"
TOOL_MARK = "fairgate-tool-ran"


@pytest.fixture(scope="module")
def clients() -> Path:
    """The installed clients; a missing one skips the module locally and fails under CI."""
    missing = [b for b in ("claude", "codex") if not (BIN / b).exists()]
    if missing:
        msg = f"{', '.join(missing)} not installed in {CLIENTS}: run scripts/ensure_clients.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return BIN


def _config(mock_url: str) -> str:
    base = f"base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}'"
    return (
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: ant, provider: anthropic, {base}, models: [claude-sonnet-4]}}\n"
        f"  - {{id: chat, provider: mock, {base}, models: [gpt-4o-mini]{FAULTS}}}\n"
        f"  - {{id: resp, provider: openai, protocol: responses, {base}, models: [resp-model]}}\n"
        f"  - {{id: tiny, provider: mock, {base}, models: [tiny-model]}}\n"
        "keys:\n"
        f"  - {{id: dev, name: dev, secret: '{KEY}',\n"
        "     allowed_providers: [mock, anthropic, openai]}\n"
        f"  - {{id: blocked, name: blocked, secret: '{BLOCKED_KEY}'}}\n"
        "pools:\n"
        "  - {id: tinypool, name: Tiny, connections: [tiny],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 1}],\n"
        "     allocations: [{key: blocked, weight: 100}]}\n"
        "model_aliases:\n"
        "  - {pattern: 'claude-*', target: claude-sonnet-4}\n"
        "  - {pattern: 'gpt-*', target: gpt-4o-mini}\n"
        "  - {pattern: 'codex-*', target: gpt-4o-mini}\n"
    )


@pytest.fixture(scope="module")
def gateway(mock_upstream: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    yield from module_gateway(tmp_path_factory.mktemp("clients"), _config(mock_upstream.url))


def _home(tmp_path: Path) -> dict[str, str]:
    """A private HOME with telemetry and updates off: nothing of the machine's user leaks in."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    return {
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CODEX_HOME": str(home / ".codex"),
        "WORK": str(work),
    }


def _run(
    args: list[str], env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        env=env,
        cwd=env["WORK"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _claude(gw: Proc, tmp_path: Path, key: str = KEY, **extra: str) -> dict[str, str]:
    env = _home(tmp_path)
    env.update(ANTHROPIC_BASE_URL=gw.url, ANTHROPIC_API_KEY=key)
    env.update(extra)
    return env


def _codex(gw: Proc, tmp_path: Path, key: str = KEY) -> dict[str, str]:
    """Codex's own defaults (model, tools, reasoning, retries) with one provider: the
    gateway."""
    env = _home(tmp_path)
    (Path(env["CODEX_HOME"]) / "config.toml").write_text(
        'model_provider = "fairgate"\n'
        "[model_providers.fairgate]\n"
        'name = "fairgate"\n'
        f'base_url = "{gw.url}/v1"\n'
        'env_key = "FAIRGATE_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    env["FAIRGATE_API_KEY"] = key
    return env


def _mock_models(mock: Proc) -> dict[str, int]:
    stats = httpx.get(mock.url + "/_mock/stats", timeout=10).json()
    return dict(stats["by_model"])


def test_the_pinned_versions_are_installed(clients: Path) -> None:
    claude = subprocess.run(
        [clients / "claude", "--version"], capture_output=True, text=True, check=True
    )
    codex = subprocess.run(
        [clients / "codex", "--version"], capture_output=True, text=True, check=True
    )
    assert claude.stdout.split()[0] == CLAUDE_VERSION
    assert codex.stdout.split()[-1] == CODEX_VERSION


def test_claude_code_default_model_plain_prompt(
    clients: Path, gateway: Proc, mock_upstream: Proc, tmp_path: Path
) -> None:
    before = _mock_models(mock_upstream).get("claude-sonnet-4", 0)
    done = _run(["claude", "-p", "say hi", "--output-format", "json"], _claude(gateway, tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["is_error"] is False
    assert out["result"].startswith("mock reply:")
    # Claude Code asked for its own default (an Opus name); the alias sent it to the target
    assert any(m.startswith("claude-opus") for m in out["modelUsage"]), out["modelUsage"]
    assert _mock_models(mock_upstream).get("claude-sonnet-4", 0) > before


def _stream_events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("model", ["claude-sonnet-4", "gpt-4o-mini", "resp-model"])
def test_claude_code_tool_loop_on_each_upstream_wire(
    clients: Path, gateway: Proc, tmp_path: Path, model: str
) -> None:
    prompt = f'mock-tool Bash {{"command": "echo {TOOL_MARK}", "description": "say it"}}'
    args = ["claude", "-p", prompt, "--model", model, "--output-format", "stream-json"]
    args += ["--verbose", "--allowedTools", "Bash"]
    done = _run(args, _claude(gateway, tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = _stream_events(done.stdout)
    uses = [
        b
        for e in events
        if e.get("type") == "assistant"
        for b in e["message"]["content"]
        if b.get("type") == "tool_use"
    ]
    assert [u["name"] for u in uses] == ["Bash"]
    assert uses[0]["input"]["command"] == f"echo {TOOL_MARK}"  # whole, never input: {}
    results = [
        b
        for e in events
        if e.get("type") == "user"
        for b in e["message"]["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert TOOL_MARK in json.dumps(results)
    final = events[-1]
    assert final["type"] == "result"
    assert final["is_error"] is False
    assert "fairgate tool ran" in final["result"]  # the mock answered from the tool's output


def test_codex_default_config_plain_prompt(
    clients: Path, gateway: Proc, mock_upstream: Proc, tmp_path: Path
) -> None:
    before = _mock_models(mock_upstream).get("gpt-4o-mini", 0)
    done = _run(["codex", "exec", "--skip-git-repo-check", "say hi"], _codex(gateway, tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "mock reply: say hi" in done.stdout
    assert _mock_models(mock_upstream).get("gpt-4o-mini", 0) > before


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-sonnet-4", "resp-model"])
def test_codex_tool_loop_on_each_upstream_wire(
    clients: Path, gateway: Proc, tmp_path: Path, model: str
) -> None:
    prompt = f'mock-tool exec_command {{"cmd": "echo {TOOL_MARK}"}}'
    args = ["codex", "exec", "--skip-git-repo-check", "--json", "-m", model, prompt]
    done = _run(args, _codex(gateway, tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = _stream_events(done.stdout)
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i.get("type") == "command_execution"]
    assert commands, items
    assert TOOL_MARK in commands[0]["aggregated_output"]
    messages = [i["text"] for i in items if i.get("type") == "agent_message"]
    assert messages
    assert messages[-1].startswith("mock reply:")  # answered after the tool's output came back


def test_quota_block_reason_reaches_each_client(
    clients: Path, gateway: Proc, tmp_path: Path
) -> None:
    """The pool allows one request an hour: the first passes, then each client is refused with
    fairgate's 429, and shows fairgate's reason and retry time (Claude Code in its result, Codex
    on stderr)."""
    first = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {BLOCKED_KEY}"},
        json={"model": "tiny-model", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert first.status_code == 200, first.text
    # both with their default retries: each retry is refused at once, and the user sees the
    # reason within seconds (Codex: five stream retries; Claude Code: none on this 429)
    env = _claude(gateway, tmp_path / "c", BLOCKED_KEY)
    claude = _run(["claude", "-p", "hi", "--model", "tiny-model", "--output-format", "json"], env)
    out = json.loads(claude.stdout)
    print("claude shows:", out["result"])  # the closing note quotes it
    assert out["is_error"] is True
    assert out["api_error_status"] == 429
    assert "Provider mock quota window is saturated" in out["result"], out["result"]
    assert re.search(r"retry in \d+ s", out["result"]), out["result"]
    codex = _run(
        ["codex", "exec", "--skip-git-repo-check", "-m", "tiny-model", "hi"],
        _codex(gateway, tmp_path / "x", BLOCKED_KEY),
    )
    assert codex.returncode != 0
    shown = codex.stdout + codex.stderr
    print("codex shows:", [line for line in shown.splitlines() if "ERROR" in line])
    # Codex prints no body of an HTTP 429, only its status; fairgate tells it response.failed
    assert "rate limit exceeded: Provider mock quota window is saturated" in shown, shown[-3000:]
    assert re.search(r"retry after \d+ s", shown), shown[-3000:]


def _mock_routes(mock: Proc) -> dict[str, int]:
    return dict(httpx.get(mock.url + "/_mock/stats", timeout=10).json()["by_route"])


def test_claude_code_context_counts_tokens_without_a_message(
    clients: Path, gateway: Proc, mock_upstream: Proc, tmp_path: Path
) -> None:
    """``/context`` counts with ``POST /v1/messages/count_tokens`` (free upstream): no
    ``/v1/messages`` call with ``max_tokens: 1`` is spent on it."""
    before = _mock_routes(mock_upstream)
    done = _run(["claude", "-p", "/context", "--output-format", "json"], _claude(gateway, tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Context Usage" in json.loads(done.stdout)["result"]
    after = _mock_routes(mock_upstream)
    count = "/v1/messages/count_tokens"
    assert after.get(count, 0) > before.get(count, 0)
    assert after.get("/v1/messages", 0) == before.get("/v1/messages", 0)


def test_claude_code_parallel_tool_calls_through_a_chat_upstream(
    clients: Path, gateway: Proc, tmp_path: Path
) -> None:
    """Two calls the chat upstream interleaves by index (start 0, start 1, args 0, args 1, …)
    reach Claude Code whole, each with its own input, and both run."""
    prompt = (
        'mock-tool Bash {"command": "echo first-call", "description": "one"}\n'
        'mock-tool Bash {"command": "echo second-call", "description": "two"}'
    )
    args = ["claude", "-p", prompt, "--model", "gpt-4o-mini", "--output-format", "stream-json"]
    args += ["--verbose", "--allowedTools", "Bash"]
    done = _run(args, _claude(gateway, tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = _stream_events(done.stdout)
    commands = [
        b["input"].get("command")
        for e in events
        if e.get("type") == "assistant"
        for b in e["message"]["content"]
        if b.get("type") == "tool_use"
    ]
    assert commands == ["echo first-call", "echo second-call"]
    results = json.dumps([e for e in events if e.get("type") == "user"])
    assert "first-call" in results
    assert "second-call" in results


def test_codex_default_model_runs_its_code_mode_tool(
    clients: Path, gateway: Proc, tmp_path: Path
) -> None:
    """Codex's default model (gpt-6.2-sol in 0.171.0) works in code mode: its only direct tool is
    the freeform ``exec`` (JavaScript calling the nested tools) inside the ``functions``
    namespace, declared in an ``additional_tools`` input item. In front of a chat upstream it is
    a function with one string argument; its call comes back as a ``custom_tool_call`` that
    Codex runs."""
    script = 'const r = await tools.exec_command({cmd: "echo fairgate-$((6*7))"});\n'
    script += "text(JSON.stringify(r));"
    prompt = "mock-tool exec " + json.dumps({"input": script})
    done = _run(["codex", "exec", "--skip-git-repo-check", prompt], _codex(gateway, tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shown = done.stdout + done.stderr
    assert "fairgate-42" in shown  # the shell ran (the prompt holds only "$((6*7))")
    assert "mock reply:" in done.stdout  # and the answer came after the tool's output
