"""Structured logs in logfmt or JSON, and "say it once" for repeated failures.

Log calls pass their fields with `extra={...}`; both formatters print every field that is not
one of the standard LogRecord attributes, so `log.warning("gpu lost", extra={"gpu": 1})` becomes
`level=warn msg="gpu lost" gpu=1` or `{"level": "warn", "msg": "gpu lost", "gpu": 1}`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from typing import Final

_STANDARD_ATTRIBUTES: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}
_LEVEL_NAMES: Final = {"WARNING": "warn", "CRITICAL": "error"}
LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": _timestamp(record),
        "level": _LEVEL_NAMES.get(record.levelname, record.levelname.lower()),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    fields.update(
        (key, value)
        for key, value in record.__dict__.items()
        if key not in _STANDARD_ATTRIBUTES and not key.startswith("_")
    )
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        fields["error"] = f"{type(error).__name__}: {error}"
    return fields


def _logfmt_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(char in text for char in ' ="\\\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str, separators=(",", ":"))


def configure(level: str, log_format: str) -> None:
    """Send every log line of the process to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])


class LogOnce:
    """Remembers which causes were already reported, so a failure repeating every second is
    logged when it starts and not 86,400 times a day. `forget` re-arms a cause once it cleared."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[tuple[object, ...]] = set()
        self._lock = threading.Lock()

    def __call__(
        self,
        level: int,
        cause: tuple[object, ...],
        message: str,
        *,
        fields: dict[str, object] | None = None,
        exc_info: BaseException | None = None,
    ) -> bool:
        with self._lock:
            if cause in self._seen:
                return False
            self._seen.add(cause)
        self._logger.log(level, message, extra=fields or {}, exc_info=exc_info)
        return True

    def unexpected(
        self,
        cause: tuple[object, ...],
        message: str,
        error: BaseException,
        *,
        fields: dict[str, object] | None = None,
    ) -> bool:
        """An error nothing anticipated (a bug, or an answer gpuscope does not understand): one
        line at error level the first time this error (type and text) is seen under `cause`, and
        its traceback at debug level."""
        described = f"{type(error).__name__}: {error}"
        first = self(
            logging.ERROR,
            (*cause, type(error).__name__, str(error)[:200]),
            message,
            fields={**(fields or {}), "error": described[:500]},
        )
        if first and self._logger.isEnabledFor(logging.DEBUG):
            self._logger.debug(
                message,
                extra={"traceback": "".join(traceback.format_exception(error)).rstrip()},
            )
        return first

    def __contains__(self, cause: tuple[object, ...]) -> bool:
        with self._lock:
            return cause in self._seen

    def forget(self, cause: tuple[object, ...]) -> None:
        with self._lock:
            self._seen.discard(cause)

    def forget_matching(self, prefix: tuple[object, ...]) -> None:
        with self._lock:
            self._seen = {cause for cause in self._seen if cause[: len(prefix)] != prefix}
