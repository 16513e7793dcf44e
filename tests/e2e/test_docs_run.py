"""The walkthroughs of the docs, run: a page that stops working fails CI.

Each test extracts the marked blocks of a page or section (``docs_support``: run, file, skip)
and runs them in order in one bash session in a scratch directory, with the real ``fairgate``
of this checkout, the real mock upstream, Redis and PostgreSQL. The text is run as written but
for the substitutions each test lists with its reason: free ports for the documented ones
(other test runs use the machine), a database and scratch directories of the run, and the few
placeholders a reader fills in by copying what an earlier step printed. Where a needed tool or
service is missing the test skips on a developer machine and fails under ``CI``.

No wall-clock assertion: servers are waited for by polling with a generous bound, and what is
checked is what the pages promise (an answer, a refusal, a value read back).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docs_support import (
    DocsError,
    Run,
    Substitution,
    clean_env,
    run_script,
    script_of,
    section_blocks,
)
from e2e_support import free_port

#: A whole walkthrough on a busy 2-core host: a few server starts of up to a minute each.
PAGE_TIMEOUT_S = 600


def need(ok: bool, what: str) -> None:
    """A missing tool or service: skip here, fail under CI (where it must be there)."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(what)
        pytest.skip(what)


def need_tools(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    need(not missing, f"the docs' walkthroughs need {', '.join(missing)} on the PATH")


def ports(*documented: int) -> list[Substitution]:
    """Each documented port becomes a free one (as a whole number: 20128 but not 201280)."""
    return [
        Substitution(rf"(?<!\d){p}(?!\d)", str(free_port()), "another job may hold the port")
        for p in documented
    ]


def run_page(
    page: str,
    section: str | None,
    subs: list[Substitution],
    workdir: Path,
    *,
    before: str = "",
    after: str = "",
    env: dict[str, str] | None = None,
) -> Run:
    script = script_of(section_blocks(page, section), subs, before=before, after=after)
    run = run_script(script, workdir, clean_env(env or {}, workdir), PAGE_TIMEOUT_S)
    assert run.returncode == 0, f"docs/{page} failed (exit {run.returncode}):\n{run.tail()}"
    return run


def after(run: Run, *needles: str) -> None:
    """Each needle appears in the output, in this order (what the page says one sees)."""
    at = 0
    for needle in needles:
        found = run.output.find(needle, at)
        assert found >= 0, f"{needle!r} not in the output after position {at}:\n{run.tail()}"
        at = found + len(needle)


def substituted(text: str, subs: list[Substitution]) -> str:
    for sub in subs:
        text = sub.apply(text)
    return text


def activate() -> Substitution:
    """``. .venv/bin/activate``: the checkout's venv is the one running this test."""
    script = Path(sys.executable).parent / "activate"
    return Substitution(
        r"\. \.venv/bin/activate",
        f". {script}" if script.exists() else "true",
        "the checkout's venv is the one running this test",
    )


def demo_key(name: str) -> str:
    """A demo key as the demo printed it to ``name`` (the first: alice's)."""
    return f"$(grep -o 'fg-demo-[A-Za-z0-9_-]\\{{24\\}}' {name} | head -1)"


@dataclass
class PgServer:
    """The PostgreSQL server of the suite (``postgres_db_url``), seen as the pages see theirs:
    ``-h 127.0.0.1 -U postgres`` on port 5432; databases the pages create get names of the
    run, dropped afterwards."""

    host: str
    port: int
    user: str
    admin_url: str
    created: list[str] = field(default_factory=list)

    def database(self) -> str:
        name = f"fgdocs_{uuid.uuid4().hex[:10]}"
        self.created.append(name)
        return name

    def subs(self) -> list[Substitution]:
        why = "the suite's PostgreSQL server"
        return [
            Substitution(
                r"-h 127\.0\.0\.1 -U postgres", f"-h {self.host} -p {self.port} -U {self.user}", why
            ),
            Substitution(
                r"postgres@127\.0\.0\.1:5432", f"{self.user}@{self.host}:{self.port}", why
            ),
        ]


@pytest.fixture
def pg_server(postgres_db_url: str) -> Iterator[PgServer]:
    """Fails under CI (skips here) when PostgreSQL is not reachable, as ``postgres_db_url``."""
    import psycopg

    u = urllib.parse.urlparse(postgres_db_url)
    server = PgServer(
        u.hostname or "127.0.0.1", u.port or 5432, u.username or "postgres", postgres_db_url
    )
    yield server
    with psycopg.connect(postgres_db_url, autocommit=True) as conn:
        for name in server.created:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# -- the blocks are marked --------------------------------------------------------------------

RUN_SECTIONS = [
    ("getting-started.md", None),
    ("deploy.md", "Two replicas on one machine, step by step"),
    ("subscriptions.md", "Walkthrough: two keys share a Codex subscription"),
    ("coming-from.md", "From LiteLLM"),
    ("clients.md", None),
    ("maintenance.md", None),
]


@pytest.mark.parametrize(("page", "section"), RUN_SECTIONS)
def test_every_block_of_a_run_section_is_marked(page: str, section: str | None) -> None:
    """Fast and with no service: a block added to a walkthrough without saying whether it runs
    fails here, before anything starts."""
    script = script_of(section_blocks(page, section), [])
    assert "=== docs-test:" in script


def test_the_runner_fails_on_a_failing_block_and_an_unmarked_one(tmp_path: Path) -> None:
    """The runner does not swallow a failure: a command that fails ends the page with its
    place, and a block without a marker is refused before anything runs."""
    page = (
        "# T\n\n<!-- docs-test: run -->\n```bash\necho one\nfalse\necho never\n```\n\n"
        "<!-- docs-test: skip not here -->\n```bash\nexit 0\n```\n"
    )
    chosen = section_blocks("t.md", None, text=page)
    run = run_script(script_of(chosen, []), tmp_path, clean_env({}, tmp_path), 60)
    assert run.returncode != 0
    assert "docs/t.md:4" in run.output
    assert "one" in run.output
    assert "never" not in run.output
    with pytest.raises(DocsError, match=r"docs/t.md:3\b"):
        section_blocks("t.md", None, text="# T\n\n```bash\ntrue\n```\n")
    bad = section_blocks("t.md", None, text="# T\n<!-- docs-test: run -->\n```bash\nx &\n```\n")
    with pytest.raises(DocsError, match="--port"):
        script_of(bad, [])


# -- the pages, run ---------------------------------------------------------------------------


def test_getting_started(tmp_path: Path) -> None:
    """The demo, a key of one's own in the pool, the watch, rotate and revoke, then a config
    file checked and served: the whole page, in order."""
    need_tools("bash", "curl", "sed", "grep")
    subs = [
        Substitution(
            r"\bmake demo\b",
            "fairgate demo --port 20128 > demo.out 2>&1",
            "the Makefile's demo target is `.venv/bin/fairgate demo`; this Python already has "
            "fairgate, the port must be a free one, and later steps read what the demo printed",
        ),
        activate(),
        Substitution(
            r'"<a demo key>"',
            '__import__("re").search(r"fg-demo-[\\w-]{24}", open("demo.out").read()).group()',
            "a demo key, as the demo printed it",
        ),
        Substitution(
            "<the admin key the demo printed>",
            "$(sed -n 's/^admin key: //p' demo.out)",
            "the admin key, as the demo printed it",
        ),
        Substitution(
            r'(fairgate keys create --name "Dana" [^\n]*)',
            r"\1 | tee dana.out",
            "the secret is printed once: keep what was printed for the next step",
            template=True,
        ),
        Substitution(
            "<the secret keys create printed>",
            "$(grep -o 'fg-[A-Za-z0-9_-]\\{40,\\}' dana.out | head -1)",
            "dana's secret, as keys create printed it",
        ),
        Substitution(r"--watch\b", "--watch --count 2", "--watch runs until Ctrl-C"),
        Substitution(
            "<sha256 hex>",
            hashlib.sha256(b"fg-team-b-stand-in").hexdigest(),
            "a key's hash, as sha256sum prints it",
        ),
        *ports(20128),
    ]
    run = run_page("getting-started.md", None, subs, tmp_path)
    after(
        run,
        "mock reply",  # the python example's answer
        "Gateway: ok",
        "Key dana created.",
        "Key dana added to pool demo.",
        '"choices"',
        "Pool demo at",
        "dana",
        "Key dana rotated.",
        "fairgate.yaml is valid: 2 connection(s), 2 key(s), 1 pool(s), 0 combo(s)",
        "on http://127.0.0.1:",  # the file's gateway started
    )


@pytest.mark.slow
def test_two_replicas_walkthrough(
    tmp_path: Path, pg_server: PgServer, redis_url: str, redis_prefix: str
) -> None:
    """Two replicas on one PostgreSQL (its own schema) and one Redis: a request through each,
    one allocation changed through A with the others kept, read back from B, and the proxy's
    host name refused, then accepted once listed."""
    need_tools("bash", "curl", "jq", "createdb", "psql")
    db = pg_server.database()
    subs = [
        Substitution(
            r"\.venv/bin/pip install -e \.(?=\s)",
            "python3 -c 'import redis'",
            "this venv has the base install: check the Redis client it provides",
        ),
        activate(),
        Substitution(r"(?<=-U postgres )fairgate\b", db, "a database of the run"),
        Substitution(r"(?<=-d )fairgate\b", db, "a database of the run"),
        Substitution(r"(?<=:5432/)fairgate(?=\?)", db, "a database of the run"),
        *pg_server.subs(),
        Substitution(r"redis://127\.0\.0\.1:6379/0", redis_url, "the suite's Redis"),
        Substitution(
            r"/tmp/fg-([abc])", f"{tmp_path}/fg-\\1", "scratch directories", template=True
        ),
        *ports(9999, 20128, 20129, 20130),
    ]
    # the suite's Redis is shared: the replicas' keys go under a prefix of this test (cleaned up)
    run = run_page(
        "deploy.md",
        "Two replicas on one machine, step by step",
        subs,
        tmp_path,
        env={"QUOTA_STORE_REDIS_PREFIX": redis_prefix},
    )
    after(
        run,
        '"total_tokens"',
        '"total_tokens"',  # one answer through each replica
        "Key team-a updated in pool shared",
        '{"key":"team-a","weight":90,"policy":"hard","capValue":null,"capUnit":null}',
        '{"key":"team-b","weight":10,"policy":"soft","capValue":500,"capUnit":"requests"}',
        "400",  # the proxy's Host on a loopback replica
        '"ok"',  # ... and on the one that lists it
    )


def test_subscriptions_walkthrough(tmp_path: Path) -> None:
    """Two keys on a Codex subscription (the mock's): Responses and chat through it, the OAuth
    state in /health, then a login through the admin API and one through the CLI."""
    need_tools("bash", "curl", "jq")
    subs = ports(9999, 20128)
    run = run_page(
        "subscriptions.md", "Walkthrough: two keys share a Codex subscription", subs, tmp_path
    )
    after(
        run,
        "mock",  # the Responses answer
        "mock",  # the chat answer
        '"codex-1"',  # /health's oauth entry
        '"state":"ok"',  # the admin API's login answer
        "codex-1",  # the CLI's login
    )


def test_litellm_translation_passes_config_check(tmp_path: Path) -> None:
    need_tools("bash")
    run = run_page("coming-from.md", "From LiteLLM", [], tmp_path)
    after(run, "fairgate.yaml is valid: 2 connection(s), 2 key(s), 1 pool(s), 1 combo(s)")


def test_clients_page(tmp_path: Path) -> None:
    """The SDK examples and the curl calls of each client, against the demo."""
    need_tools("bash", "curl", "grep")
    port = ports(20128)
    subs = [Substitution("<a client key>", demo_key("demo.out"), "a key the demo printed"), *port]
    before = substituted("fairgate demo --port 20128 > demo.out 2>&1 &\n__docs_wait $! 20128", port)
    run = run_page("clients.md", None, subs, tmp_path, before=before)
    after(
        run,
        "mock reply",  # chat completions
        "mock reply",  # Responses
        "mock reply",  # the Anthropic SDK
        '"type":"message"',  # curl as Claude Code
        "event: response.completed",  # curl as Codex
        "claude-sonnet-4",  # /v1/models
    )


#: The gateway the backup page finds running: a connection with a sealed secret, a key made
#: through the API (not in the file), a pool, and traffic counted in the quota store.
BACKUP_CONFIG = """\
server: {default_provider: mock}
connections:
  - {id: mock-1, provider: mock, base_url: "http://127.0.0.1:9999/v1", secret: "sk-upstream-0001",
     models: [gpt-4o-mini]}
pools:
  - {id: team, connections: [mock-1], dimensions: [{unit: requests, window: hourly, limit: 100}]}
"""

BACKUP_BEFORE = f"""\
cat > gw.yaml <<'YAML'
{BACKUP_CONFIG}YAML
export FAIRGATE_ADMIN_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
export FAIRGATE_URL=http://127.0.0.1:20128
fairgate mock-upstream --port 9999 --secret sk-upstream-0001 > mock.log 2>&1 &
__docs_wait $! 9999
fairgate serve --config gw.yaml --port 20128 --data-dir /var/lib/fairgate > gw.log 2>&1 &
__docs_wait $! 20128
ERIN=$(fairgate keys create --name Erin --id erin --json | jq -r .secret)
fairgate pools allow team erin --weight 100 > /dev/null
for i in 1 2 3; do
  curl -s $FAIRGATE_URL/v1/chat/completions -H "Authorization: Bearer $ERIN" \\
    -H 'Content-Type: application/json' \\
    -d '{{"model": "gpt-4o-mini", "messages": [{{"role": "user", "content": "hi"}}]}}' > /dev/null
done
# the counts reach the file within milliseconds (memory mode): wait until they are there
deadline=$((SECONDS + 120))
COUNTED='SELECT (SELECT COUNT(*) FROM quota_counter) + (SELECT COUNT(*) FROM quota_reservation)'
until [ -s /var/lib/fairgate/quota.sqlite.batches ] \\
    || [ "$(sqlite3 /var/lib/fairgate/quota.sqlite "$COUNTED")" != 0 ]; do
  (( SECONDS < deadline )) || {{ echo 'no count reached quota.sqlite' >&2; exit 1; }}
  sleep 0.1
done
# the PostgreSQL database the page dumps: migrated and seeded by a gateway of its own
createdb -h 127.0.0.1 -U postgres fairgate
export PG_SECRET_KEY=$(fairgate secret-key)
FAIRGATE_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/fairgate \\
  FAIRGATE_SECRET_KEY=$PG_SECRET_KEY \\
  fairgate serve --config gw.yaml --port 20129 --data-dir pg-host > pg.log 2>&1 &
__docs_wait $! 20129
fairgate keys create --name Pat --id pat --url http://127.0.0.1:20129 > /dev/null
"""

BACKUP_AFTER = """\
fairgate mock-upstream --port 9999 --secret sk-upstream-0001 > mock2.log 2>&1 &
__docs_wait $! 9999
# the restored SQLite directory, served without the config file: what it holds is the backup's
fairgate serve --port 20128 --data-dir /var/lib/fairgate > restored.log 2>&1 &
__docs_wait $! 20128
fairgate keys list --json | jq -c '[.[].id]'
fairgate connections test mock-1 --json | jq -c '{ok}'
fairgate pools usage team --json | jq -c '.dimensions[0].keys[] | {keyId, consumed}'
# the restored PostgreSQL database, with the key it was sealed with
FAIRGATE_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/fairgate_restored \\
  FAIRGATE_SECRET_KEY=$PG_SECRET_KEY \\
  fairgate serve --port 20129 --data-dir pg-host-2 > pg2.log 2>&1 &
__docs_wait $! 20129
fairgate keys list --json --url http://127.0.0.1:20129 | jq -c '["pg", [.[].id]]'
fairgate connections test mock-1 --json --url http://127.0.0.1:20129 | jq -c '["pg", {ok}]'
"""


@pytest.mark.slow
def test_backup_and_restore(tmp_path: Path, pg_server: PgServer) -> None:
    """A live SQLite data directory and a PostgreSQL database backed up as the page says,
    restored as it says, and served again: the keys made through the API are back, the
    sealed upstream secret opens, and the quota counts came back without being counted twice."""
    need_tools("bash", "curl", "jq", "sqlite3", "createdb", "pg_dump", "pg_restore")
    db, restored = pg_server.database(), pg_server.database()
    subs = [
        Substitution(r"/var/lib/fairgate", str(tmp_path / "lib-fairgate"), "a scratch directory"),
        Substitution(r"/var/backups/fairgate", str(tmp_path / "backups"), "a scratch directory"),
        Substitution(r"\bfairgate_restored\b", restored, "a database of the run"),
        Substitution(r"(?<=-U postgres )fairgate\b", db, "a database of the run"),
        Substitution(r'(?<=\.pgdump" )fairgate\b', db, "a database of the run"),
        Substitution(r"(?<=:5432/)fairgate\b", db, "a database of the run"),
        *pg_server.subs(),
        *ports(9999, 20128, 20129),
    ]
    run = run_page(
        "maintenance.md",
        None,
        subs,
        tmp_path,
        before=substituted(BACKUP_BEFORE, subs),
        after=substituted(BACKUP_AFTER, subs),
    )
    after(run, "ok", '["erin"]', '{"ok":true}', '["pg",["pat"]]', '["pg",{"ok":true}]')
    consumed = re.findall(r'\{"keyId":"erin","consumed":([0-9.]+)\}', run.output)
    assert len(consumed) == 1, run.tail()
    assert 1 <= float(consumed[0]) <= 3, run.tail()  # never a batch counted twice
