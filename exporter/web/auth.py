"""HTTP basic auth against bcrypt hashes, with the answers cached.

bcrypt is slow on purpose (about 60 ms at cost 10 here), far slower than a scrape. As in
Prometheus's exporter-toolkit, each (user, hash, password) answer is computed once and cached:
keyed by a SHA-256 digest, so no password is kept, in a bounded LRU, so that guessing cannot grow
memory. bcrypt runs in one thread of its own (`run`), so a flood of wrong passwords costs one core
at most and never delays the event loop or the sampler. An unknown user is checked against a
fixed hash, so the answer takes as long as for a known one (no user enumeration by timing), and
the hash comparison itself is bcrypt's constant-time one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from typing import Final

import bcrypt

CACHE_SIZE: Final = 1024
MAX_PASSWORD_BYTES: Final = 72
_UNKNOWN_USER_HASH: Final = b"$2b$10$laMuVCNilHXuVdop5.sJdOvvrCKFdT1GcJT2rlglGvh/yvhfNTi.u"
"""bcrypt (cost 10) of a string no password equals: the work an unknown user's check does."""


def credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) from an `Authorization: Basic ...` header; None when absent or malformed."""
    if header is None:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class BasicAuth:
    def __init__(self, users: tuple[tuple[str, str], ...], *, cache_size: int = CACHE_SIZE) -> None:
        self._users = {user: hashed.encode() for user, hashed in users}
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def _key(self, user: str, password: str) -> tuple[bytes, bytes]:
        hashed = self._users.get(user, _UNKNOWN_USER_HASH)
        digest = hashlib.sha256(
            b"\0".join(
                (
                    user.encode("utf-8", "surrogatepass"),
                    hashed,
                    password.encode("utf-8", "surrogatepass"),
                )
            )
        ).digest()
        return digest, hashed

    def cached(self, user: str, password: str) -> bool | None:
        """The answer if it is known already (cheap: call it on the event loop)."""
        key, _ = self._key(user, password)
        with self._lock:
            answer = self._cache.get(key)
            if answer is not None:
                self._cache.move_to_end(key)
            return answer

    def verify(self, user: str, password: str) -> bool:
        """Check with bcrypt and remember the answer. Blocking: ~60 ms at cost 10."""
        key, hashed = self._key(user, password)
        # bcrypt reads 72 bytes at most (the hash was made from no more); bcrypt 5 refuses longer.
        secret = password.encode("utf-8", "surrogatepass")[:MAX_PASSWORD_BYTES]
        try:
            matches = bcrypt.checkpw(secret, hashed)
        except ValueError:  # a hash bcrypt cannot read (the config's check should have caught it)
            matches = False
        answer = matches and user in self._users
        with self._lock:
            self._cache[key] = answer
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return answer
