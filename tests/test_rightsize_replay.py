"""Policy replay (`gpuscope rightsize --simulate`): the setting, the placement search on
per-step demand vectors, and the policies over a workload set whose answers are known."""

from __future__ import annotations

import pytest
from aiohttp import web

from exporter.rightsize.options import load
from exporter.rightsize.replay.policies import POLICIES, parse_policies
from exporter.settings import ConfigError
from tests.rightsize_run import rightsize, serving

pytestmark = pytest.mark.timeout(120)

EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


# -- the setting --------------------------------------------------------------------------------


def test_policies_are_parsed_in_their_order_each_once() -> None:
    assert parse_policies("binpack, current,binpack") == ("current", "binpack")
    assert parse_policies(["mig", "timeslice,EXCLUSIVE"]) == ("exclusive", "mig", "timeslice")
    config = load(["--prometheus=http://p:9090", f"--simulate={','.join(POLICIES)}"], {})
    assert config.simulate == POLICIES
    assert load(["--prometheus=http://p:9090"], {}).simulate == ()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("current,timeshare", "unknown policy 'timeshare'"),
        (",", "expected policies"),
    ],
)
def test_a_bad_policy_is_a_config_error_naming_it(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        load(["--prometheus=http://p:9090", f"--simulate={value}"], {})
    assert str(raised.value).startswith("invalid --simulate: ")


def test_an_unknown_policy_exits_2_with_one_line_before_any_query() -> None:
    queries: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        queries.append(str((await request.post()).get("query")))
        return web.json_response(EMPTY)

    with serving(answer) as url:
        result = rightsize("--prometheus", url, "--simulate=current,binpak", timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        (
            "gpuscope rightsize: error: invalid --simulate: unknown policy 'binpak': one of "
            "current, exclusive, mig, timeslice, binpack"
        )
    ]
    assert queries == []
