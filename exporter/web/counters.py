"""What the endpoint turned away, as the daemon's own families: connections closed by the guard,
malformed requests, and requests refused by the web config's checks and the request limit.

The listener and the security checks count on the event loop; the sampling cycle reads a `WebCounts`
(`WebSecurity.counts()`) in its worker thread and `exporter.app` writes the families below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from exporter.series import Family

REFUSALS: Final = ("unauthorized", "forbidden", "auth_busy", "rate_limited", "busy")
"""Why a request was refused: 401, 403, 429 (too many credential checks at once), 429 (the web
config's rate limit), 503 (`--web.max-requests`)."""
CLOSES: Final = ("header_timeout", "evicted", "refused")

CONNECTIONS_OPEN: Final = Family(
    "gpuscope_http_connections_open",
    "Connections open to the listener.",
    gpu=False,
)
CONNECTIONS_MAX: Final = Family(
    "gpuscope_http_connections_max",
    "Connections the listener keeps open at most; past it the one idle longest is closed.",
    gpu=False,
)
CONNECTIONS_CLOSED: Final = Family(
    "gpuscope_http_connections_closed",
    "Connections the listener closed: header_timeout (a request header, or a TLS handshake, not "
    "done within 10 s), evicted (to make room: idle the longest, else the answer waiting longest "
    "on a client that does not read, when a new one came past the cap or a descriptor was "
    "wanted; the oldest TLS handshake past those under way at most; the oldest unfinished "
    "request past the bytes held at most), refused (past the cap, every connection had a "
    "request being answered).",
    kind="counter",
    labels=("reason",),
    gpu=False,
)
BAD_REQUESTS: Final = Family(
    "gpuscope_http_bad_requests",
    "Requests refused as malformed (400): not HTTP/1.x, or a request line or header that is "
    "invalid or too long.",
    kind="counter",
    gpu=False,
)
REQUESTS_REFUSED: Final = Family(
    "gpuscope_http_requests_refused",
    "Requests refused: unauthorized (401), forbidden (403), auth_busy (429: too many credential "
    "checks at once), rate_limited (429), busy (503: --web.max-requests).",
    kind="counter",
    labels=("reason",),
    gpu=False,
)
FAMILIES: Final = (
    CONNECTIONS_OPEN,
    CONNECTIONS_MAX,
    CONNECTIONS_CLOSED,
    BAD_REQUESTS,
    REQUESTS_REFUSED,
)


@dataclass(frozen=True, slots=True)
class WebCounts:
    """The endpoint's counts at one moment."""

    connections_open: int
    connections_max: int
    closed: tuple[tuple[str, int], ...]
    """By reason, in `CLOSES` order."""
    bad_requests: int
    refused: tuple[tuple[str, int], ...]
    """By reason, in `REFUSALS` order."""

    def by_family(self) -> tuple[tuple[Family, tuple[tuple[tuple[str, ...], int], ...]], ...]:
        """Each family with its samples (label values, value): what the daemon and the report
        server export of the endpoint, each with its own metric builder."""
        return (
            (CONNECTIONS_OPEN, (((), self.connections_open),)),
            (CONNECTIONS_MAX, (((), self.connections_max),)),
            (CONNECTIONS_CLOSED, tuple(((reason,), value) for reason, value in self.closed)),
            (BAD_REQUESTS, (((), self.bad_requests),)),
            (REQUESTS_REFUSED, tuple(((reason,), value) for reason, value in self.refused)),
        )
