"""The value parsers of `gpuscope rightsize`'s settings (`options.py`): each turns one
setting's text into its value, or raises `ValueError` with the reason that follows
"invalid --flag: " (a URL's userinfo never quoted)."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from exporter.documents import quote, size_text
from exporter.durations import format_duration
from exporter.rightsize.configmap import ConfigMapTarget, parse_target
from exporter.rightsize.history import DEVICE_LABELS
from exporter.rightsize.notify import Webhook, parse_webhook
from exporter.rightsize.prometheus import (
    after_authority,
    shown_url,
)
from exporter.rightsize.selection import Requirement, parse_namespaces, parse_selector
from exporter.rightsize.settings import listed
from exporter.settings import (
    PATH_QUOTE_LIMIT,
    parse_path,
    text,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

MAX_CLOCK_SKEW_SECONDS: Final = 300.0
"""How far past this machine's clock `--end` may lie (another machine's clock may run ahead)."""
MAX_SELECTOR_LENGTH: Final = 4096
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name (RFC 9110's token)."""
MAX_HEADER_VALUE: Final = 8192
"""Longest `--prometheus.header` value: servers refuse longer header lines (8 KiB is nginx's
and Go's usual limit)."""
_SIZE: Final = re.compile(r"(\d{1,13})\s*(B|KiB|MiB|GiB)?")
_LABEL: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,127}")
_SIZE_UNITS: Final = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


# -- value parsers ------------------------------------------------------------------------------


def parse_url(value: object) -> str:
    """An http(s) URL; userinfo in it (`http://alice:pw@host`) is a secret, never quoted."""
    url = text(value).strip()
    if "@" in after_authority(url):
        # The userinfo ended early, at a delimiter in the password: what follows would be
        # taken for the path (or the host, with a number before the delimiter).
        raise ValueError(
            f"{quote(shown_url(url))}: credentials in it must percent-encode '/', '?' and '#' "
            "(%2F, %3F, %23)"
        )
    try:
        parts = urlsplit(url) if url.isprintable() and " " not in url else None
        # `port` raises ValueError for a port that is not a number.
        valid = (
            parts is not None
            and parts.scheme in {"http", "https"}
            and bool(parts.hostname)
            and (parts.port or 0) >= 0
        )
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"{quote(shown_url(url))} is not an http:// or https:// URL")
    return url


def parse_end(value: object) -> float:
    """A moment, RFC 3339 or unix seconds, from the epoch up to `MAX_CLOCK_SKEW_SECONDS` ahead."""
    if isinstance(value, datetime):  # a YAML timestamp
        spelled, seconds = value.isoformat(), _timestamp(value, value.isoformat())
    else:
        spelled = text(value).strip()
        try:
            seconds = float(spelled)
        except ValueError:
            seconds = _timestamp(_rfc3339(spelled), spelled)
    if not math.isfinite(seconds):
        raise ValueError(f"{quote(spelled)} is not a moment in time")
    if seconds < 0:
        raise ValueError(f"{quote(spelled)} is before 1970")
    if seconds > time.time() + MAX_CLOCK_SKEW_SECONDS:
        raise ValueError(
            f"{quote(spelled)} is in the future (more than "
            f"{format_duration(MAX_CLOCK_SKEW_SECONDS)} ahead of this machine's clock)"
        )
    return seconds


def _rfc3339(spelled: str) -> datetime:
    try:
        return datetime.fromisoformat(spelled)
    except ValueError:
        raise ValueError(f"{quote(spelled)} is neither RFC 3339 nor unix seconds") from None


def _timestamp(moment: datetime, spelled: str) -> float:
    if moment.tzinfo is None:
        raise ValueError(f"{quote(spelled)} needs a time zone (e.g. Z)")
    return moment.timestamp()


def parse_namespace_list(values: object) -> tuple[str, ...]:
    return parse_namespaces([text(value) for value in listed(values)])


def parse_selector_text(value: object) -> tuple[Requirement, ...]:
    spelled = text(value)
    if len(spelled) > MAX_SELECTOR_LENGTH:
        raise ValueError(f"longer than {MAX_SELECTOR_LENGTH} characters")
    return parse_selector(spelled) if spelled.strip() else ()


def parse_username(value: object) -> str:
    user = text(value)
    if not user or ":" in user or not user.isprintable():
        raise ValueError(
            f"{quote(user)} is not a basic-auth user (no colon, no control characters)"
        )
    return user


def parse_headers(values: object) -> tuple[tuple[str, str], ...]:
    """`Name: value` headers (a value may hold commas: `Accept: a, b`). A value may be a secret
    (a tenant, a token), so an error names the header, never its value."""
    headers: list[tuple[str, str]] = []
    for number, value in enumerate(listed(values), 1):
        name, colon, content = text(value).strip().partition(":")
        if not colon or not _HEADER_NAME.fullmatch(name.strip()):
            raise ValueError(f"header #{number} is not 'Name: value' (not shown: it may be secret)")
        if not content.strip().isprintable() or len(content) > MAX_HEADER_VALUE:
            raise ValueError(
                f"the value of {quote(name.strip())} has control characters or is longer than "
                f"{MAX_HEADER_VALUE} characters (not shown: it may be secret)"
            )
        headers.append((name.strip(), content.strip()))
    return tuple(headers)


def size_between(low: int, high: int) -> Callable[[object], int]:
    """A size in bytes: `33554432`, `512KiB`, `32MiB`, `1GiB`."""

    def parse(value: object) -> int:
        spelled = text(value).strip()
        match = _SIZE.fullmatch(spelled)
        if match is None:
            raise ValueError(f"{quote(spelled)} is not a size (e.g. 512KiB, 32MiB, 1GiB)")
        size = int(match[1]) * _SIZE_UNITS[match[2] or "B"]
        if not low <= size <= high:
            raise ValueError(f"{size_text(size)} is outside {size_text(low)}..{size_text(high)}")
        return size

    return parse


def parse_output(value: object) -> Path:
    path = parse_path(value)
    if not path.parent.is_dir():
        raise ValueError(f"directory {quote(str(path.parent), PATH_QUOTE_LIMIT)} does not exist")
    return path


def parse_configmap(value: object) -> ConfigMapTarget:
    return parse_target(text(value))


def parse_cluster_label(value: object) -> str:
    label = text(value).strip()
    if not _LABEL.fullmatch(label) or label.startswith("__"):
        raise ValueError(f"{quote(label)} is not a Prometheus label name")
    if label in {*DEVICE_LABELS, "container", "model", "mig_profile", "resource"}:
        raise ValueError(f"{quote(label)} is one of the daemon's own labels")
    return label


def parse_webhooks(values: object) -> tuple[Webhook, ...]:
    return tuple(parse_webhook(text(value)) for value in listed(values) if text(value).strip())


def parse_report_url(value: object) -> str:
    return parse_url(value)
