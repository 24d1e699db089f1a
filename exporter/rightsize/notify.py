"""A summary of the report, posted to webhooks after a run (`--notify URL`, repeatable).

Three services, told apart by the URL: Slack's incoming webhooks (`https://hooks.slack.com/...`,
or any URL written `slack+https://...`) get blocks — the money to save, the top workloads, a
button to the report (`--report-url`); Microsoft Teams (`https://*.webhook.office.com/...`, a
Power Automate workflow `https://*.logic.azure.com/...` or `*.powerplatform.com/...`, or
`teams+https://...`) an Adaptive Card in a message attachment; anything else written
`json+https://...` the summary as plain JSON.

A webhook URL is a credential (whoever has a Slack webhook's path can post to the channel): it is
never logged, quoted in an error or shown by `repr()` — only its service, scheme and host are
(`slack https://hooks.slack.com/...`). Each post is bounded: `--notify-timeout` per attempt, a
second attempt after `RETRY_SECONDS` only for a failure worth it (no connection, a timeout, 429,
5xx), redirects not followed, at most `MAX_ANSWER_BYTES` of the answer read. A failure is logged
in one line and never fails the report.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import aiohttp

from exporter.documents import quote
from exporter.durations import format_duration
from exporter.rightsize.formatters.common import recommendation_label, timestamp, workload_label
from exporter.rightsize.names import comment_text
from exporter.rightsize.report import money_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.rightsize.report import Report
    from exporter.rightsize.row import WorkloadRow

log = logging.getLogger("exporter.rightsize.notify")

SLACK: Final = "slack"
TEAMS: Final = "teams"
JSON: Final = "json"
SERVICES: Final = (SLACK, TEAMS, JSON)
TOP_WORKLOADS: Final = 5
RETRY_SECONDS: Final = 2.0
MAX_ANSWER_BYTES: Final = 64 * 1024
_TEAMS_HOSTS: Final = ("webhook.office.com", "logic.azure.com", "powerplatform.com")
_MARKDOWN: Final = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>])")


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a summary goes. `str()` and `repr()` never show the URL's secret parts."""

    service: str
    url: str = field(repr=False)
    """The http(s) URL posted to: a credential."""

    @property
    def shown(self) -> str:
        """The service, scheme and host: what logs and errors may say."""
        return f"{self.service} {redacted(self.url)}"

    def __str__(self) -> str:
        return self.shown


def redacted(url: str) -> str:
    """`https://hooks.slack.com/...`: the scheme and host of a URL, never its path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}/..."


def parse_webhook(text: str) -> Webhook:
    """`slack+https://...`, `teams+https://...`, `json+https://...`, or a Slack or Teams URL
    recognised by its host. Raises `ValueError` naming the URL without its secret parts."""
    spelled = text.strip()
    service, plus, rest = spelled.partition("+")
    if plus and service.lower() in SERVICES and "://" in rest:
        service, url = service.lower(), rest
    else:
        service, url = "", spelled
    try:
        parts = urlsplit(url) if url.isprintable() and " " not in url else None
        host = parts.hostname if parts is not None else None
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in {"http", "https"} or not host:
        shown = redacted(url) if "://" in url else quote(url[:12])
        raise ValueError(f"{shown} is not an http:// or https:// URL")
    if not service:
        if host == "hooks.slack.com":
            service = SLACK
        elif any(host == name or host.endswith("." + name) for name in _TEAMS_HOSTS):
            service = TEAMS
        else:
            raise ValueError(
                f"{redacted(url)}: cannot tell which service it is; write slack+https://..., "
                "teams+https://... or json+https://..."
            )
    return Webhook(service, url)


# -- what is said -------------------------------------------------------------------------------


def _top(report: Report) -> list[WorkloadRow]:
    changes = [
        row for row in report.rows if (row.savings or 0) > 0 or row.recommendation.cpu_changes
    ]
    changes.sort(key=lambda row: -(row.savings or 0.0))
    return changes[:TOP_WORKLOADS]


def _line(row: WorkloadRow) -> str:
    """What to do with one workload and what it saves."""
    recommendation = row.recommendation
    what = {
        "release": "release its GPU",
        "move": f"move to {recommendation_label(row)}",
        "add CPU": "give it more CPU",
    }.get(recommendation.action, recommendation.action)
    saving = f", {money_text(row.savings)} a month" if row.savings else ""
    return f"{what}{saving} ({row.confidence_level} confidence)"


def headline(report: Report) -> str:
    total = report.total
    changes = sum(1 for row in report.rows if row.recommendation.action not in {"keep", "none"})
    return (
        f"GPU rightsizing: {money_text(total.savings)} a month to save "
        f"({changes} of {len(report.rows)} workloads to change)"
    )


def _overview(report: Report) -> str:
    total, consolidation = report.total, report.consolidation
    return (
        f"{money_text(total.current)} a month now, {money_text(total.recommended)} recommended: "
        f"{money_text(total.savings)} a month, {money_text(total.savings * 12)} a year. GPUs "
        f"{consolidation.gpus_before} -> {consolidation.gpus_after}, utilization "
        f"{consolidation.utilization_before:.0%} -> {consolidation.utilization_after:.0%}. "
        f"{format_duration(report.window_seconds)} of history to {timestamp(report.end)}."
    )


def _slack_text(text: str) -> str:
    """Slack's mrkdwn: each line's control and format characters (a bidirectional override
    that would make a name read backwards, a zero-width space hiding in one) as spaces, as on a
    Teams card (`comment_text`); &, < and > escaped (a label cannot make a link or a mention)."""
    lines = "\n".join(comment_text(line) for line in text.split("\n"))
    return lines.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(report: Report, report_url: str | None) -> dict[str, Any]:
    """An incoming webhook's message: header, overview, top workloads, a button to the report."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": headline(report)[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _slack_text(_overview(report))}},
    ]
    top = _top(report)
    if top:
        blocks.append(
            {
                "type": "section",
                "fields": [
                    {
                        "type": "mrkdwn",
                        "text": _slack_text(f"*{workload_label(row)}*\n{_line(row)}")[:2000],
                    }
                    for row in top
                ],
            }
        )
    if report_url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open the report"},
                        "url": report_url,
                    }
                ],
            }
        )
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": _slack_text(f"gpuscope {report.version}, from {report.source}"),
                }
            ],
        }
    )
    return {"text": headline(report), "blocks": blocks}


def _teams_text(text: str) -> str:
    """Text for an Adaptive Card's Markdown (a TextBlock, a fact's title and value): one line,
    and every ASCII punctuation character Markdown could read as formatting (emphasis, a link,
    a list, a heading) escaped with a backslash, so that a label shows as written."""
    return _MARKDOWN.sub(r"\\\1", comment_text(text))


def teams_payload(report: Report, report_url: str | None) -> dict[str, Any]:
    """A message whose one attachment is an Adaptive Card (Teams' webhooks and workflows)."""
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {
                "type": "TextBlock",
                "text": headline(report),
                "size": "Large",
                "weight": "Bolder",
                "wrap": True,
            },
            {"type": "TextBlock", "text": _overview(report), "wrap": True},
            {
                "type": "FactSet",
                "facts": [
                    {"title": _teams_text(workload_label(row)), "value": _teams_text(_line(row))}
                    for row in _top(report)
                ],
            },
            {
                "type": "TextBlock",
                "text": _teams_text(f"gpuscope {report.version}, from {report.source}"),
                "isSubtle": True,
                "size": "Small",
                "wrap": True,
            },
        ],
    }
    if report_url:
        card["actions"] = [
            {"type": "Action.OpenUrl", "title": "Open the report", "url": report_url}
        ]
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


def json_payload(report: Report, report_url: str | None) -> dict[str, Any]:
    """The summary as plain data, for any receiver."""
    total = report.total
    return {
        "title": headline(report),
        "generated_at": timestamp(report.end),
        "source": report.source,
        "window": format_duration(report.window_seconds),
        "report_url": report_url,
        "summary": {
            "workloads": len(report.rows),
            "classifications": report.classification_counts,
            "cost_current_usd_per_month": round(total.current, 2),
            "cost_recommended_usd_per_month": round(total.recommended, 2),
            "savings_usd_per_month": round(total.savings, 2),
            "savings_usd_per_year": round(total.savings * 12, 2),
            "gpus_before": report.consolidation.gpus_before,
            "gpus_after": report.consolidation.gpus_after,
        },
        "top_workloads": [
            {
                **({"cluster": row.cluster} if row.cluster else {}),
                "namespace": row.history.namespace,
                "kind": row.history.kind,
                "workload": row.history.name,
                "action": row.recommendation.action,
                "recommended": row.target_label,
                "savings_usd_per_month": None if row.savings is None else round(row.savings, 2),
                "confidence": row.confidence_level,
            }
            for row in _top(report)
        ],
    }


PAYLOADS: Final = {SLACK: slack_payload, TEAMS: teams_payload, JSON: json_payload}


# -- how it is sent -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sent:
    webhook: Webhook
    ok: bool
    detail: str
    """`HTTP 200`, or why not."""


class _Retry(Exception):
    """A failure worth a second attempt."""


async def notify(
    report: Report,
    webhooks: Sequence[Webhook],
    *,
    report_url: str | None = None,
    attempt_seconds: float = 10.0,
    retry_seconds: float = RETRY_SECONDS,
) -> list[Sent]:
    """Post the summary to every webhook at once, each attempt within `attempt_seconds`; each
    outcome, logged."""
    if not webhooks:
        return []
    limit = aiohttp.ClientTimeout(total=attempt_seconds)
    async with aiohttp.ClientSession(timeout=limit) as session:
        return list(
            await asyncio.gather(
                *(
                    _send(session, report, webhook, report_url, retry_seconds)
                    for webhook in webhooks
                )
            )
        )


async def _send(
    session: aiohttp.ClientSession,
    report: Report,
    webhook: Webhook,
    report_url: str | None,
    retry_seconds: float,
) -> Sent:
    payload = PAYLOADS[webhook.service](report, report_url)
    detail = ""
    for attempt in (1, 2):
        try:
            detail = await _post(session, webhook.url, payload)
        except _Retry as problem:
            detail = str(problem)
            if attempt == 1:
                await asyncio.sleep(retry_seconds)
            continue
        except _Final as problem:
            detail = str(problem)
            break
        log.info("notification sent", extra={"webhook": webhook.shown, "answer": detail})
        return Sent(webhook, ok=True, detail=detail)
    log.warning("notification failed", extra={"webhook": webhook.shown, "error": detail})
    return Sent(webhook, ok=False, detail=detail)


class _Final(Exception):
    """A failure another attempt would not mend."""


async def _post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> str:
    try:
        async with session.post(url, json=payload, allow_redirects=False) as response:
            answer = await response.content.read(MAX_ANSWER_BYTES)
            status = response.status
    except TimeoutError as error:
        raise _Retry("no answer in time") from error
    except aiohttp.ClientConnectorError as error:
        errno = error.os_error.errno
        reason = os.strerror(errno).lower() if errno else type(error.os_error).__name__
        raise _Retry(f"cannot connect: {reason}") from error
    except aiohttp.ClientError as error:
        raise _Retry(f"connection failed ({type(error).__name__})") from error
    text = answer[:200].decode("utf-8", "replace").replace("\n", " ").strip()
    if 200 <= status <= 299:
        return f"HTTP {status}"
    failure = f"HTTP {status}" + (f": {text}" if text else "")
    if status == 429 or status >= 500:  # too many requests, server errors
        raise _Retry(failure)
    raise _Final(failure)
