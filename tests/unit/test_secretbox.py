"""Secrets at rest (fairgate.secretbox): real Fernet, real files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fairgate.secretbox import ENV_VAR, KEY_FILE, PREFIX, SecretBox, SecretKeyError, load_box

SECRET = "sk-live-0123456789abcdef"


def test_sealed_value_hides_the_secret_and_opens_back() -> None:
    box = SecretBox([SecretBox.generate_key()])
    sealed = box.seal(SECRET)
    assert sealed.startswith(PREFIX)
    assert SECRET not in sealed
    assert box.seal(SECRET) != sealed  # random IV: equal secrets do not look equal
    assert box.open(sealed) == SECRET
    assert box.open("legacy-clear-value") == "legacy-clear-value"  # stored before encryption
    assert box.seal("") == ""
    assert "key" not in repr(box).lower().replace("keys=", "")


def test_rotation_new_key_first_old_key_still_opens() -> None:
    old, new = SecretBox.generate_key(), SecretBox.generate_key()
    sealed_old = SecretBox([old]).seal(SECRET)
    both = SecretBox([new, old])
    assert both.open(sealed_old) == SECRET
    resealed = both.reseal(sealed_old)
    assert SecretBox([new]).open(resealed) == SECRET
    with pytest.raises(SecretKeyError) as exc:
        SecretBox([new]).open(sealed_old)
    assert SECRET not in str(exc.value)
    assert both.reseal("clear") != "clear"
    assert both.open(both.reseal("clear")) == "clear"


def test_bad_key_is_a_clear_error() -> None:
    with pytest.raises(SecretKeyError, match=ENV_VAR):
        SecretBox([b"not-a-fernet-key"])


def test_key_file_is_generated_once_with_0600(tmp_path: Path) -> None:
    box, created = load_box(tmp_path / "data", None)
    assert created
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created_again = load_box(tmp_path / "data", None)
    assert not created_again
    assert again.open(box.seal(SECRET)) == SECRET  # same key both times


def test_env_key_wins_over_the_file(tmp_path: Path) -> None:
    key = SecretBox.generate_key()
    box, created = load_box(tmp_path, key.decode())
    assert not created
    assert not (tmp_path / KEY_FILE).exists()
    assert SecretBox([key]).open(box.seal(SECRET)) == SECRET


def test_workers_starting_together_agree_on_one_whole_key(tmp_path: Path) -> None:
    """Eight processes' worth of first starts racing on one data dir: exactly one creates the
    key file, and every one reads a whole key, the same one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: load_box(tmp_path, None), range(8)))
    assert sum(created for _, created in results) == 1
    sealed = results[0][0].seal("x")
    assert all(box.open(sealed) == "x" for box, _ in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY_FILE]  # no temporary left


def test_a_shared_db_requires_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SecretKeyError, match=ENV_VAR):
        load_box(tmp_path, None, shared_db=True)
    box, created = load_box(tmp_path, SecretBox.generate_key().decode(), shared_db=True)
    assert not created
    assert box.open(box.seal("y")) == "y"
