"""Private files: the data directory and the SQLite files in it are the owner's alone.

Why: the metadata DB holds the upstream credentials (they must be sent upstream, so they are
stored as given) and the hashes of the client keys; the quota DB tells who uses what. A
directory created 0755 with 0644 files hands all of it to every local user. The directory is
made 0700 and each SQLite file 0600 *before* SQLite opens it, so the ``-wal`` and ``-shm``
files SQLite creates next to it take the same mode (SQLite copies the database file's mode).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
#: The files SQLite keeps beside a database in WAL mode (and the rollback journal).
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) as 0700; an existing directory we own is tightened too."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _tighten(p, DIR_MODE)
    return p


def private_sqlite(path: str | os.PathLike[str]) -> Path:
    """Make the SQLite file at ``path`` 0600 before it is opened: created empty with that mode
    when missing (SQLite treats an empty file as a new database), tightened with its side files
    when present. ``:memory:`` is left alone."""
    if os.fspath(path) == ":memory:":
        return Path(path)
    p = Path(path)
    private_dir(p.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    for f in (p, *(p.with_name(p.name + s) for s in SQLITE_SIDE_FILES)):
        _tighten(f, FILE_MODE)
    return p


def _tighten(p: Path, mode: int) -> None:
    """chmod when the file is ours and looser than ``mode`` (another owner's file is theirs)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return
    if st.st_uid == os.geteuid() and st.st_mode & 0o777 & ~mode:
        os.chmod(p, mode)
