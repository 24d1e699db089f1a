"""Notifications: webhook URLs parsed and never shown, Slack's blocks, the Teams Adaptive Card and
the plain JSON checked by a local receiver, and failures that stay failures of the notification."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from exporter.rightsize.notify import (
    JSON,
    SLACK,
    TEAMS,
    Webhook,
    notify,
    parse_webhook,
    redacted,
    slack_payload,
    teams_payload,
)
from exporter.rightsize.options import load
from exporter.settings import ConfigError
from tests.prometheus_server import free_port
from tests.rightsize_data import sample_report
from tests.rightsize_run import serving

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(60)

SECRET = "T0000/B0000/webhook-token-never-logged"
REPORT_URL = "https://rightsize.example/#class=underused"


class Receiver:
    """A webhook receiver on loopback: records every request; answers as told."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.status = 200
        self.delay = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, request.content_type, await request.json()))
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=self.status, text="ok" if self.status == 200 else "no_service")


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    target = Receiver()
    with serving(target.handle) as url:
        yield target, url


def send(*webhooks: Webhook, **options: Any) -> Any:
    return asyncio.run(
        notify(sample_report(), webhooks, report_url=REPORT_URL, retry_seconds=0.05, **options)
    )


def test_urls_name_their_service_and_never_show_their_secret() -> None:
    slack = parse_webhook(f"https://hooks.slack.com/services/{SECRET}")
    assert slack.service == SLACK
    assert SECRET not in repr(slack)
    assert SECRET not in str(slack)
    assert str(slack) == "slack https://hooks.slack.com/..."
    assert (
        parse_webhook("https://acme.webhook.office.com/webhookb2/x@y/IncomingWebhook/z").service
        == TEAMS
    )
    assert (
        parse_webhook("https://prod-1.westus.logic.azure.com:443/workflows/x?sig=y").service
        == TEAMS
    )
    plain = parse_webhook(f"json+http://127.0.0.1:8080/hook/{SECRET}")
    assert (plain.service, plain.url) == (JSON, f"http://127.0.0.1:8080/hook/{SECRET}")
    assert parse_webhook(f"slack+http://[::1]:9/{SECRET}").shown == "slack http://[::1]:9/..."
    with pytest.raises(ValueError, match="cannot tell which service") as unknown:
        parse_webhook(f"https://chat.example/{SECRET}")
    assert SECRET not in str(unknown.value)
    with pytest.raises(ValueError, match="is not an http") as scheme:
        parse_webhook(f"ftp://hooks.slack.com/{SECRET}")
    assert SECRET not in str(scheme.value)
    assert redacted("http://user:pass@host:81/path?q=1") == "http://host:81/..."


def test_a_bad_notify_url_is_one_line_without_the_secret() -> None:
    with pytest.raises(ConfigError) as error:
        load(["--prometheus=http://127.0.0.1:1", f"--notify=https://chat.example/{SECRET}"], {})
    assert str(error.value).startswith("invalid --notify: https://chat.example/...: cannot tell")
    assert SECRET not in str(error.value)
    config = load(
        ["--prometheus=http://127.0.0.1:1"],
        {
            "GPUSCOPE_RIGHTSIZE_NOTIFY": f"https://hooks.slack.com/services/{SECRET},json+https://x/y"
        },
    )
    assert [webhook.service for webhook in config.notify] == [SLACK, JSON]


def test_slack_teams_and_json_payloads(receiver: tuple[Receiver, str]) -> None:
    target, url = receiver
    sent = send(
        Webhook(SLACK, f"{url}/slack/{SECRET}"),
        Webhook(TEAMS, f"{url}/teams/{SECRET}"),
        Webhook(JSON, f"{url}/json/{SECRET}"),
    )
    assert [outcome.ok for outcome in sent] == [True, True, True]
    payloads = {path.split("/")[1]: (kind, body) for path, kind, body in target.requests}
    assert {kind for kind, _ in payloads.values()} == {"application/json"}
    report = sample_report()

    slack = payloads["slack"][1]
    assert slack["text"].startswith(
        f"GPU rightsizing: ${report.total.savings:,.0f} a month to save"
    )
    blocks = slack["blocks"]
    assert [block["type"] for block in blocks] == [
        "header",
        "section",
        "section",
        "actions",
        "context",
    ]
    assert blocks[0]["text"]["type"] == "plain_text"
    assert len(blocks[0]["text"]["text"]) <= 150
    assert blocks[1]["text"]["type"] == "mrkdwn"
    fields = blocks[2]["fields"]
    assert 1 <= len(fields) <= 10
    assert all(field["type"] == "mrkdwn" and len(field["text"]) <= 2000 for field in fields)
    assert fields[0]["text"].startswith("*research/notebook*\nrelease its GPU, $5,022 a month")
    # A label cannot become a link or a mention: Slack's control characters are escaped.
    first = report.rows[0]
    mention = replace(first, history=replace(first.history, name="<!channel>"))
    escaped = slack_payload(replace(report, rows=(mention, *report.rows[1:])), None)
    assert escaped["blocks"][2]["fields"][0]["text"].startswith("*research/&lt;!channel&gt;*")
    assert [block["type"] for block in escaped["blocks"]] == [
        "header",
        "section",
        "section",
        "context",
    ]
    (button,) = blocks[3]["elements"]
    assert (button["type"], button["url"]) == ("button", REPORT_URL)

    teams = payloads["teams"][1]
    assert teams["type"] == "message"
    (attachment,) = teams["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert (card["type"], card["version"]) == ("AdaptiveCard", "1.4")
    assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    kinds = [element["type"] for element in card["body"]]
    assert kinds == ["TextBlock", "TextBlock", "FactSet", "TextBlock"]
    facts = card["body"][2]["facts"]
    assert facts[0] == {
        "title": "research/notebook",
        "value": r"release its GPU, $5,022 a month \(high confidence\)",
    }
    assert all(set(fact) == {"title", "value"} and isinstance(fact["value"], str) for fact in facts)
    assert card["actions"] == [
        {"type": "Action.OpenUrl", "title": "Open the report", "url": REPORT_URL}
    ]

    plain = payloads["json"][1]
    assert plain["report_url"] == REPORT_URL
    assert plain["summary"]["savings_usd_per_month"] == pytest.approx(
        report.total.savings, abs=0.01
    )
    assert plain["summary"]["workloads"] == 7
    assert plain["top_workloads"][0] == {
        "namespace": "research",
        "kind": "StatefulSet",
        "workload": "notebook",
        "action": "release",
        "recommended": "release",
        "savings_usd_per_month": pytest.approx(5022.4, abs=0.01),
        "confidence": "high",
    }
    assert len(plain["top_workloads"]) <= 5


def test_failures_are_logged_once_without_the_secret_and_retried_if_worth_it(
    receiver: tuple[Receiver, str], caplog: pytest.LogCaptureFixture
) -> None:
    target, url = receiver
    caplog.set_level(logging.INFO, logger="exporter.rightsize.notify")
    target.status = 503
    (busy,) = send(Webhook(SLACK, f"{url}/{SECRET}"))
    assert not busy.ok
    assert busy.detail == "HTTP 503: no_service"
    assert len(target.requests) == 2, "a 503 is tried once more"
    target.requests.clear()
    target.status = 404
    (gone,) = send(Webhook(SLACK, f"{url}/{SECRET}"))
    assert (gone.ok, gone.detail) == (False, "HTTP 404: no_service")
    assert len(target.requests) == 1, "a 404 is final"
    dead = f"http://127.0.0.1:{free_port()}/{SECRET}"
    (refused,) = send(Webhook(JSON, dead))
    assert refused.detail == "cannot connect: connection refused"
    target.status, target.delay = 200, 2.0
    (slow,) = send(Webhook(TEAMS, f"{url}/{SECRET}"), attempt_seconds=0.3)
    assert slow.detail == "no answer in time"
    failures = [r for r in caplog.records if r.getMessage() == "notification failed"]
    assert len(failures) == 4
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert all(SECRET not in str(value) for value in record.__dict__.values())


def test_a_teams_card_shows_labels_as_written_not_as_markdown() -> None:
    """A workload named like a link or emphasis (a forged label) is text on the card."""
    report = sample_report()
    forged = "[open](https://attacker.example)**now**_x_\n- item"
    rows = tuple(
        replace(row, history=replace(row.history, name=forged)) if index == 0 else row
        for index, row in enumerate(report.rows)
    )
    card = teams_payload(replace(report, rows=rows), None)["attachments"][0]["content"]
    facts = card["body"][2]["facts"]
    titles = [fact["title"] for fact in facts]
    escaped = r"\[open\]\(https://attacker\.example\)\*\*now\*\*\_x\_ \- item"
    assert any(title.endswith(escaped) for title in titles), titles
    for fact in facts:
        for text in (fact["title"], fact["value"]):
            unescaped = list(re.finditer(r"(?<!\\)[\[\]()*_]", text))
            assert not unescaped, text
            assert "\n" not in text


def test_a_slack_message_carries_no_bidirectional_or_zero_width_character() -> None:
    """A forged name with U+202E (read backwards) or U+200B (hidden) shows as written."""
    report = sample_report()
    forged = "evil\u202etxt.exe\u200bnotebook"
    rows = tuple(
        replace(row, history=replace(row.history, name=forged)) if index == 0 else row
        for index, row in enumerate(report.rows)
    )
    payload = json.dumps(slack_payload(replace(report, rows=rows), None), ensure_ascii=False)
    assert "\u202e" not in payload
    assert "\u200b" not in payload
    assert "evil txt.exe notebook" in payload
