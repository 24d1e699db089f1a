"""HTTP basic auth against bcrypt hashes, with the answers cached.

bcrypt is slow on purpose (about 60 ms at cost 10 here), far slower than a scrape. As in
Prometheus's exporter-toolkit, each (user, hash, password) answer is computed once and cached,
keyed by a SHA-256 digest, so that no password is kept. Valid answers and failures are cached
apart, each bounded: guessing cannot grow memory, and a flood of wrong guesses cannot push a
valid client's answer out of the cache (only a client that knows a password can add a valid
answer). bcrypt runs in one thread of its own, its checks queued fairly between client addresses
(`CredentialChecks`), so a flood of wrong passwords costs one core at most, never delays the
event loop or the sampler, and cannot keep a real client's first check waiting behind it. An
unknown user is checked against a fixed hash, so the answer takes as long as for a known one, and
the hash comparison itself is bcrypt's constant-time one. (Under a flood of guesses, checks for
unknown user names are shed first, so user names are not secret from someone who floods.)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.supervise import DaemonExecutor

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

log = logging.getLogger(__name__)

CACHE_SIZE: Final = 1024
"""Failed (user, password) answers remembered: the same wrong guess is refused without bcrypt."""
VALID_CACHE_SIZE: Final = 64
"""Valid answers remembered; only a client that knows a password can add one."""
MAX_PASSWORD_BYTES: Final = 72
AUTH_QUEUE: Final = 64
"""Checks of credentials not in the cache under way (waiting for bcrypt, or in it) at most: one
per client address, so a flood from up to this many addresses waits its turn rather than racing
for places."""
AUTH_RETRY_SECONDS: Final = 1.0
"""After a client address's credentials fail, its next uncached ones wait this long."""
AUTH_WAIT_SECONDS: Final = 5.0
"""A check that has not started after this long is shed (429)."""
FAILED_MEMORY_SECONDS: Final = 600.0
"""An address whose check failed within this long waits behind addresses not seen failing."""
FAILED_CLIENTS: Final = 4096
"""Addresses remembered as having failed, at most (the least recent forgotten first)."""
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


@dataclass(eq=False, slots=True)
class _Check:
    """One check waiting for bcrypt or in it."""

    address: str
    known: bool
    """The config names its user."""
    clean: bool
    """Its address was not seen failing (within `FAILED_MEMORY_SECONDS`)."""
    job: Callable[[], bool]
    answer: asyncio.Future[bool | None]


class CredentialChecks:
    """bcrypt's checks of credentials not in the cache, shared fairly between client addresses.
        Event loop only (but for the checks themselves).

        One check runs at a time, in a daemon thread (`gpuscope-auth`: a flood costs one core at
        most, and nothing waits for that thread at exit). At most `size` checks are under way
        (waiting or running), half of them at most for user names the config does not have, one per
        client address, and none from an address within `retry_seconds` of one of its checks
        failing; past those the check is shed (None: the caller answers 429). The next to run is not
        first come, first served: checks from addresses not seen failing within
        `FAILED_MEMORY_SECONDS` go first (the latest first), the others in turn; when every place is
    taken, a check from
        such an address takes the place of the latest waiting one from an address that failed, and a
        check that waits `wait_seconds` without starting is shed. So a flood of wrong passwords from
        many addresses delays a real scraper's first check (after a restart, from an address of its
        own) by the checks of never-seen addresses ahead of it at most, while bcrypt's work stays
        one thread and the waiting stays `size` checks."""

    def __init__(
        self,
        *,
        size: int = AUTH_QUEUE,
        retry_seconds: float = AUTH_RETRY_SECONDS,
        wait_seconds: float = AUTH_WAIT_SECONDS,
        clients: int = FAILED_CLIENTS,
    ) -> None:
        self._size = size
        self._retry_seconds = retry_seconds
        self._wait_seconds = wait_seconds
        self._clients = clients
        self._waiting: list[_Check] = []
        self._running: _Check | None = None
        self._busy: set[str] = set()
        """Addresses with a check waiting or running."""
        self._failed: OrderedDict[str, float] = OrderedDict()
        """Address -> when its last check failed; the least recent first, `clients` at most."""
        self._thread: DaemonExecutor | None = None

    def __len__(self) -> int:
        """Checks under way."""
        return len(self._waiting) + (self._running is not None)

    async def check(self, address: str, auth: BasicAuth, user: str, password: str) -> bool | None:
        """Whether bcrypt accepts the credentials; None when the check is shed."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        failed_at = self._failed.get(address)
        if address in self._busy or (
            failed_at is not None and now - failed_at < self._retry_seconds
        ):
            return None
        clean = failed_at is None or now - failed_at > FAILED_MEMORY_SECONDS
        known = auth.knows(user)
        if not known and self._unknown() >= self._size // 2:
            return None
        if len(self) >= self._size and not (clean and self._shed_one()):
            return None
        check = _Check(
            address,
            known,
            clean,
            functools.partial(auth.verify, user, password),
            loop.create_future(),
        )
        self._waiting.append(check)
        self._busy.add(address)
        self._start_next()
        try:
            done, _ = await asyncio.wait((check.answer,), timeout=self._wait_seconds)
            if not done and check in self._waiting:
                self._drop(check)  # waited too long without starting: shed
            return await check.answer
        except asyncio.CancelledError:
            if check in self._waiting:
                self._drop(check)
            raise

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def _unknown(self) -> int:
        running = self._running is not None and not self._running.known
        return running + sum(not check.known for check in self._waiting)

    def _shed_one(self) -> bool:
        """Shed the latest waiting check from an address that failed before; whether there was
        one."""
        for check in reversed(self._waiting):
            if not check.clean:
                self._drop(check)
                return True
        return False

    def _drop(self, check: _Check) -> None:
        self._waiting.remove(check)
        self._busy.discard(check.address)
        if not check.answer.done():
            check.answer.set_result(None)

    def _start_next(self) -> None:
        if self._running is not None or not self._waiting:
            return
        # Never-seen addresses newest first: a flood's first checks arrive together, and a real
        # scraper that comes later should not wait behind them all (the wait deadline bounds
        # what this leaves waiting); addresses that failed in turn, oldest first.
        check = next((c for c in reversed(self._waiting) if c.clean), self._waiting[0])
        self._waiting.remove(check)
        self._running = check
        if self._thread is None:
            self._thread = DaemonExecutor("gpuscope-auth")
        loop = asyncio.get_running_loop()

        def report(done: Future[bool]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is stopping
                loop.call_soon_threadsafe(self._finished, check, done)

        self._thread.submit(check.job).add_done_callback(report)

    def _finished(self, check: _Check, future: Future[bool]) -> None:
        self._running = None
        self._busy.discard(check.address)
        error = future.exception()
        if error is not None:  # a bug in the check: a failure for this client, logged
            log.error("a credential check failed", exc_info=error)
        answer = error is None and future.result()
        if answer:
            self._failed.pop(check.address, None)
        else:
            self._failed[check.address] = asyncio.get_running_loop().time()
            self._failed.move_to_end(check.address)
            while len(self._failed) > self._clients:
                self._failed.popitem(last=False)
        if not check.answer.done():
            check.answer.set_result(answer)
        self._start_next()
