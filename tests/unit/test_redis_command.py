"""The RESP packing of the Redis lane's ``EVALSHA`` (``store/redis_lane.command``), read back by
hiredis, the parser Redis clients use: every value arrives as it was given, whatever its length
(the packing's table of bulk heads ends at 1,023 bytes; longer values take the other path)."""

from __future__ import annotations

import hiredis
import pytest

from fairgate.store.redis.lane import command

SHA = b"0123456789abcdef0123456789abcdef01234567"


def _parsed(packed: bytes) -> list[bytes]:
    reader = hiredis.Reader()
    reader.feed(packed)
    message = reader.gets()
    assert reader.gets() is False  # exactly one command, nothing left over
    assert isinstance(message, list)
    return message


@pytest.mark.parametrize(
    ("keys", "args"),
    [
        ([b"fairgate:{p}:rz", b"fairgate:{p}:act"], [b"1700002800000", b"bench", b"0.5"]),
        ([], []),
        ([b"k"], []),
        ([], [b""]),
        ([b"x" * 1023], [b"y" * 1024]),
        ([b"a" * 5000, b"b"], [b"\r\n$3\r\n", b"\x00\xff"]),
    ],
    ids=["admission", "nothing", "a key", "an empty argument", "table edge", "long and binary"],
)
def test_every_value_arrives_as_given(keys: list[bytes], args: list[bytes]) -> None:
    assert _parsed(command(SHA, keys, args)) == [
        b"EVALSHA",
        SHA,
        b"%d" % len(keys),
        *keys,
        *args,
    ]
