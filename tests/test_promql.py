"""The pure helpers behind the dashboard checks and pictures, on data."""

from __future__ import annotations

import pytest

from dashboards import promql
from dashboards.draw import format_value, legend


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('gpu_up{node=~".*"} == 0', {"gpu_up"}),
        (
            'sum by (namespace) (rate(gpu_pod_busy_seconds_total{pod="a"}[5m])) / on (uuid) group_left () gpu_info',
            {"gpu_pod_busy_seconds_total", "gpu_info"},
        ),
        ("count(x) or vector(0)", {"x"}),
        (
            "time() - gpuscope_last_sample_timestamp_seconds > 1e2",
            {"gpuscope_last_sample_timestamp_seconds"},
        ),
        ("a unless a offset 15m and on (instance, uuid) (b < bool 0.5)", {"a", "b"}),
        (
            "sum_over_time((sum(allocation:gpu_allocation:share))[1h:1m]) * 1000 / 3600000",
            {"allocation:gpu_allocation:share"},
        ),
        ('topk(10, count_values("value", m))', {"m"}),
        ('ALERTS{alertname=~"Gpu.*", reason=~"a|b{1}"}', {"ALERTS"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert promql.metric_names(expr) == names


def test_substitute_every_variable_syntax() -> None:
    values = {"node": ".*", "__rate_interval": "4s", "datasource": "uid"}
    text = 'rate(x{node=~"$node"}[$__rate_interval]) [[node]] ${node} ${datasource:queryparam}'
    assert promql.substitute(text, values) == 'rate(x{node=~".*"}[4s]) .* .* uid'
    assert promql.variable_references(text) == {"node", "__rate_interval", "datasource"}
    assert promql.variable_references("${__value.raw} ${__data.fields.node}") == {
        "__value",
        "__data",
    }


def test_substitute_names_a_missing_variable() -> None:
    with pytest.raises(ValueError, match="no value for variable 'model'"):
        promql.substitute('x{model=~"$model"}', {})


def test_label_values_query() -> None:
    assert promql.label_values('label_values(gpu_info{node=~"$node"}, model)') == (
        'gpu_info{node=~"$node"}',
        "model",
    )
    with pytest.raises(ValueError, match="not a label_values"):
        promql.label_values("query_result(up)")


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.931, "percentunit", "93.1%"),
        (71 * 2**30, "bytes", "71 GiB"),
        (1630.0, "watt", "1.63 kW"),
        (2.04e9, "hertz", "2.04 GHz"),
        (3.44, "currencyUSD", "$3.44"),
        (0.0012, "s", "1.2 ms"),
        (12.5, "suffix: GPU-h", "12.5 GPU-h"),
        (42.0, "short", "42"),
    ],
)
def test_format_value(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


def test_legend_format() -> None:
    labels = {"__name__": "gpu_up", "node": "a", "gpu": "0"}
    assert legend("{{node}} GPU {{gpu}} {{mig_profile}}", labels) == "a GPU 0"
    assert legend("__auto", labels) == 'gpu_up{gpu="0", node="a"}'


def test_grafana_substitutions_are_promql_durations() -> None:
    dashboard = {"templating": {"list": [{"name": "node", "type": "query", "allValue": ".*"}]}}
    values = promql.grafana_values(dashboard, interval=1.25, scrape_seconds=1, range_seconds=300)
    assert values["__interval"] == "1250ms"
    assert values["__interval_ms"] == "1250"
    assert values["__rate_interval"] == "4s"
    assert values["__range"] == "300s"
    assert values["node"] == ".*"
