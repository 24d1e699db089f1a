"""Backoff for a write that failed (the API server down, 403, 409, a timeout): logged once per
cause until one succeeds, then said again if it fails again. One owner (the loop)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import urllib3

from exporter.attribution.cluster import ApiError, CredentialError, problem_text
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Callable

BACKOFF_SECONDS: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
API_FAILURES: Final = (ApiError, CredentialError, urllib3.exceptions.HTTPError, OSError)
"""What an API call raises when the cluster, not gpuscope, is at fault."""


class Backoff:
    """When the next attempt is due after failures in a row."""

    def __init__(self, logger: logging.Logger, *, clock: Callable[[], float]) -> None:
        self._once = LogOnce(logger)
        self._clock = clock
        self._failures = 0
        self.due_at = 0.0

    @property
    def due(self) -> bool:
        return self._clock() >= self.due_at

    def failed(self, what: str, error: Exception, fields: dict[str, object]) -> float:
        """Record a failure of `what` (logged once per cause); the seconds until the retry."""
        wait = BACKOFF_SECONDS[min(self._failures, len(BACKOFF_SECONDS) - 1)]
        self._failures += 1
        self.due_at = self._clock() + wait
        problem = problem_text(error)
        self._once(
            logging.WARNING,
            (what, problem),
            f"{what} failed; retrying",
            fields={**fields, "error": problem, "retry_in_seconds": wait},
        )
        return wait

    def succeeded(self) -> None:
        self._failures = 0
        self.due_at = 0.0
        self._once.forget_matching(())
