"""A small synchronous client of the admin API, for the ``fairgate`` admin commands.

The standard library's ``urllib`` is enough for one request at a time from a terminal and keeps
the CLI free of another HTTP dependency. Every failure becomes one :class:`AdminCliError` whose
message a person can act on: the API's own message and the fields it names, or what went wrong
on the way (no gateway at that URL, a refused admin key). The admin key is sent as a bearer
token and never appears in a message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_URL", "AdminCliError", "AdminClient", "quote"]

DEFAULT_URL = "http://127.0.0.1:20128"


class AdminCliError(Exception):
    """A failure to show the user as is (the CLI prints it and exits 2)."""


def _api_message(status: int, raw: bytes) -> str:
    """``HTTP <status>: <message>`` plus one ``  <field>: <message>`` line per named field."""
    try:
        body = json.loads(raw)
    except ValueError:
        return f"HTTP {status}: {raw.decode('utf-8', 'replace').strip()[:200] or 'no body'}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return f"HTTP {status}"
    lines = [f"HTTP {status}: {err.get('message') or err.get('type') or 'error'}"]
    for f in err.get("fields") or []:
        if isinstance(f, dict):
            lines.append(f"  {f.get('field')}: {f.get('message')}")
    return "\n".join(lines)


@dataclass(frozen=True)
class AdminClient:
    base_url: str
    admin_key: str | None
    timeout_s: float = 15.0

    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        out = self.base_url.rstrip("/") + path
        return out + ("?" + urllib.parse.urlencode(query) if query else "")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        """The decoded JSON answer (None for 204); raises :class:`AdminCliError`."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path, query), data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        if self.admin_key:
            req.add_header("authorization", f"Bearer {self.admin_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            message = _api_message(exc.code, exc.read())
            if exc.code == 401:
                message += "\n(set FAIRGATE_ADMIN_KEY, or pass --admin-key @FILE)"
            raise AdminCliError(message) from None
        except urllib.error.URLError as exc:
            reason = getattr(exc.reason, "strerror", None) or str(exc.reason)
            raise AdminCliError(
                f"cannot reach the gateway at {self.base_url} ({reason}); "
                "set FAIRGATE_URL or pass --url"
            ) from None
        except (TimeoutError, OSError) as exc:
            raise AdminCliError(
                f"no answer from {self.base_url} ({type(exc).__name__}); is the gateway running?"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise AdminCliError(f"{self.base_url} did not answer JSON: is it a fairgate?") from None

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def quote(segment: str, safe: str = "") -> str:
    """A path segment as the API expects it (a combo name may hold ``/``: pass ``safe="/"``)."""
    return urllib.parse.quote(segment, safe=safe)
