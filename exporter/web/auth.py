"""HTTP basic auth against bcrypt hashes, with the answers cached.

bcrypt is slow on purpose (about 60 ms at cost 10 here), far slower than a scrape. As in
Prometheus's exporter-toolkit, each (user, hash, password) answer is computed once and cached,
keyed by a SHA-256 digest, so that no password is kept. Valid answers and failures are cached
apart, each bounded: guessing cannot grow memory, and a flood of wrong guesses cannot push a
valid client's answer out of the cache (only a client that knows a password can add a valid
answer). bcrypt runs in one thread of its own (`exporter.web.security`), so a flood of wrong
passwords costs one core at most and never delays the event loop or the sampler. An unknown user
is checked against a fixed hash, so the answer takes as long as for a known one, and the hash
comparison itself is bcrypt's constant-time one. (Under a flood of guesses, checks for unknown
user names are shed first, so user names are not secret from someone who floods.)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from typing import Final

CACHE_SIZE: Final = 1024
"""Failed (user, password) answers remembered: the same wrong guess is refused without bcrypt."""
VALID_CACHE_SIZE: Final = 64
"""Valid answers remembered; only a client that knows a password can add one."""
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
    def __init__(
        self,
        users: tuple[tuple[str, str], ...],
        *,
        cache_size: int = CACHE_SIZE,
        valid_cache_size: int = VALID_CACHE_SIZE,
    ) -> None:
        # bcrypt (~0.4 MiB resident) is imported only when the web config has users to check.
        import bcrypt  # noqa: PLC0415 - see above

        self._checkpw = bcrypt.checkpw
        self._users = {user: hashed.encode() for user, hashed in users}
        self._valid: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._sizes = {True: valid_cache_size, False: cache_size}
        self._lock = threading.Lock()

    def knows(self, user: str) -> bool:
        """Whether the config names this user (cheap)."""
        return user in self._users

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
            for answer, cache in ((True, self._valid), (False, self._failed)):
                if key in cache:
                    cache.move_to_end(key)
                    return answer
        return None

    def verify(self, user: str, password: str) -> bool:
        """Check with bcrypt and remember the answer. Blocking: ~60 ms at cost 10."""
        key, hashed = self._key(user, password)
        # bcrypt reads 72 bytes at most (the hash was made from no more); bcrypt 5 refuses longer.
        secret = password.encode("utf-8", "surrogatepass")[:MAX_PASSWORD_BYTES]
        try:
            matches = self._checkpw(secret, hashed)
        except ValueError:  # a hash bcrypt cannot read (the config's check should have caught it)
            matches = False
        answer = matches and user in self._users
        cache = self._valid if answer else self._failed
        with self._lock:
            cache[key] = None
            cache.move_to_end(key)
            while len(cache) > self._sizes[answer]:
                cache.popitem(last=False)
        return answer
