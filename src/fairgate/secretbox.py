"""Secrets at rest: upstream keys and OAuth tokens encrypted in the metadata DB.

Why: the metadata DB is a file; a backup, a copied data dir or a stray ``sqlite3`` session must
not hand out the upstream accounts. Values are sealed with Fernet (AES-128-CBC + HMAC-SHA256,
from the ``cryptography`` package: no home-made crypto) under a key that lives outside the DB:

- ``FAIRGATE_SECRET_KEY`` (one Fernet key, or several separated by commas, the first being the
  one that seals — the others only open, which is how a key is rotated), else
- ``<data dir>/secret.key``, generated on first use with mode 0600 (the caller logs once that
  it did so, and where: losing that file loses the stored secrets).

A sealed value is ``fgenc:v1:<fernet token>``. ``open`` passes through a value without that
prefix (secrets stored before encryption existed), so an old DB keeps working and is sealed on
its next write or by ``rotate``; a token that no key opens raises ``SecretKeyError`` naming no
secret.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from fairgate.files import FILE_MODE, private_dir

__all__ = ["ENV_VAR", "KEY_FILE", "PREFIX", "SecretBox", "SecretKeyError", "load_box"]

ENV_VAR = "FAIRGATE_SECRET_KEY"
KEY_FILE = "secret.key"
PREFIX = "fgenc:v1:"


class SecretKeyError(Exception):
    """The key is unusable, or a stored secret was sealed under a key we do not have."""


class SecretBox:
    """Seal and open secrets with the first key; open with any of them."""

    __slots__ = ("_fernet", "_keys")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise SecretKeyError("no secret key given")
        try:
            self._fernet = MultiFernet([Fernet(k) for k in keys])
        except (ValueError, TypeError):
            raise SecretKeyError(
                f"{ENV_VAR} must hold Fernet keys (32 url-safe base64 bytes), comma separated"
            ) from None
        self._keys = tuple(keys)

    def __repr__(self) -> str:
        return f"SecretBox(keys={len(self._keys)})"

    @staticmethod
    def generate_key() -> bytes:
        return Fernet.generate_key()

    def seal(self, plaintext: str) -> str:
        """The stored form of ``plaintext``; the empty string stays empty (no secret)."""
        if not plaintext:
            return plaintext
        return PREFIX + self._fernet.encrypt(plaintext.encode()).decode()

    def open(self, stored: str) -> str:
        if not stored.startswith(PREFIX):
            return stored  # stored before encryption: used as is, sealed on the next write
        try:
            return self._fernet.decrypt(stored[len(PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SecretKeyError(
                f"a stored secret was sealed with a key that is not in {ENV_VAR} "
                "(or the key file); add the old key after the new one to read it"
            ) from None

    def is_sealed(self, stored: str) -> bool:
        return stored.startswith(PREFIX)

    def reseal(self, stored: str) -> str:
        """``stored`` sealed under the first key (rotation; a clear value gets sealed)."""
        if not stored:
            return stored
        if not self.is_sealed(stored):
            return self.seal(stored)
        try:
            return PREFIX + self._fernet.rotate(stored[len(PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SecretKeyError("a stored secret was sealed with an unknown key") from None


def _keys_from_env(value: str) -> list[bytes]:
    return [k.strip().encode() for k in value.split(",") if k.strip()]


def load_box(
    data_dir: str | os.PathLike[str],
    keys: str | None,
    *,
    shared_db: bool = False,
    create: bool = True,
) -> tuple[SecretBox, bool]:
    """The box for this gateway, and whether a key file was just generated (log it once).
    ``keys``: the settings' ``secret_key`` (``FAIRGATE_SECRET_KEY``); None: the key file.

    The key file is created whole, mode 0600, by one process (see :func:`_create_key_file`), so
    workers or replicas starting at once on one data dir agree on the key: the losers of the
    race read the winner's file.

    ``shared_db``: the metadata DB is shared by replicas that each have their own data dir
    (PostgreSQL). A key file per data dir would give each replica its own key, so the second
    replica could not open what the first sealed: the variable is then required.

    ``create=False``: a reader that must change nothing (``fairgate config check``) gets
    :class:`SecretKeyError` instead of a new key file."""
    if keys and keys.strip():
        return SecretBox(_keys_from_env(keys)), False
    if shared_db:
        raise SecretKeyError(
            f"{ENV_VAR} is required with a shared (PostgreSQL) metadata DB: every replica "
            "must seal and open the stored secrets with the same key. Generate one with "
            "`fairgate secret-key` and give it to every replica"
        )
    if not create:
        path = Path(data_dir) / KEY_FILE
        if not path.exists():
            raise SecretKeyError(
                f"no key for the stored secrets: {ENV_VAR} is unset and {path} does not exist"
            )
        return SecretBox(_keys_from_env(path.read_text())), False
    path = Path(private_dir(data_dir)) / KEY_FILE
    created = False
    if not path.exists():
        created = _create_key_file(path)
    return SecretBox(_keys_from_env(path.read_text())), created


def adopt_key_file(data_dir: str | os.PathLike[str], keys: str | None) -> bool:
    """After a rotation, the data dir's key file holds the key the secrets are sealed with now
    (the first of ``FAIRGATE_SECRET_KEY``), replaced whole (a private temporary file renamed
    over it). Otherwise the file kept the old key, and a gateway started later without the
    variable could open nothing it had resealed (issue 44). True when the file was rewritten;
    a data dir without a key file (a shared metadata DB) is left alone."""
    path = Path(data_dir) / KEY_FILE
    if not keys or not keys.strip() or not path.exists():
        return False
    first = _keys_from_env(keys)[0]
    if _keys_from_env(path.read_text())[:1] == [first]:
        return False
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    try:
        os.write(fd, first + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return True


def _create_key_file(path: Path) -> bool:
    """Write a new key to a private temporary file, then hard-link it into place: the link
    fails if another process won the race, and nobody ever reads a half-written key (workers
    of ``serve --workers N`` all start at once). True if this call created it."""
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    try:
        os.write(fd, Fernet.generate_key() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
