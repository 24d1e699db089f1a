"""The serving efficiency dashboard (gpuscope-serving): what each token and request costs in GPU
money and energy, per workload, served model and revision, from the serving recording rules
(inference servers' counters joined to the pods' GPU cost, busy share and energy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.layout import Layout, dashboard, query_variable
from dashboards.panels import DATASOURCE, Column, Query, bargauge, dashed, stat, table, timeseries

if TYPE_CHECKING:
    from dashboards.panels import Json

USD_PER_HOUR = "currencyUSD"
TOKENS = "workload_model:serving_output_tokens:rate5m"


def rollout_annotation(matchers: str) -> Json:
    """Marks where a workload rolls out: while more than one of its revisions serves, and for a
    rate interval after a revision starts serving (a rollout that replaces every pod at once)."""
    serving = f"workload_revision:serving:timestamp{{{matchers}}}"
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": "blue",
        "name": "Rollouts",
        "target": {
            "expr": f"count by (namespace, workload) ({serving}) > 1 or count by (namespace, "
            f"workload) ({serving} unless {serving} offset $__rate_interval)",
            "interval": "1m",
            "refId": "Anno",
        },
        "titleFormat": "Rollout of {{namespace}}/{{workload}}",
        "textFormat": "revisions serving or new: {{value}}",
        "tagKeys": "namespace,workload",
        "useValueForTime": False,
    }


def make() -> Json:
    scope = 'namespace=~"$namespace", workload=~"$workload", model=~"$model"'
    workload_scope = 'namespace=~"$namespace", workload=~"$workload"'
    price = f"workload_model:gpu_price_usd_per_hour:share_sum{{{scope}}}"
    busy_price = f"workload_model:gpu_price_usd_per_hour:busy_sum{{{scope}}}"
    output = f"{TOKENS}{{{scope}}}"
    held = f"workload_model:gpu_allocation:share_sum{{{scope}}}"
    watts = f"workload_model:gpu_pod_energy_joules:rate5m{{{scope}}}"
    by_model = "{{namespace}}/{{workload}} {{model}}"
    layout = Layout()

    layout.row("Serving efficiency")
    layout.add(
        4,
        4,
        stat(
            "Cost per million output tokens",
            "GPU price per hour of the selected serving pods that generate tokens (their "
            "allocation share of each GPU's price) over the tokens they generate in an hour, "
            "times a million.",
            Query(f"sum({price} and {output}) / (sum({output}) * 3600 > 0) * 1e6"),
            unit="currencyUSD",
            decimals=3,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Cost per million tokens",
            "The same over prompt and output tokens together.",
            Query(
                f"sum({price} and {output}) / "
                f"(sum(workload_model:serving_tokens:rate5m{{{scope}}}) * 3600 > 0) * 1e6"
            ),
            unit="currencyUSD",
            decimals=3,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Output tokens / s per GPU",
            "Tokens generated a second per GPU the generating pods hold (a shared GPU counts as "
            "the pod's share of it).",
            Query(f"sum({output}) / (sum({held} and {output}) > 0)"),
            decimals=0,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Output tokens per joule",
            "Tokens generated per joule their GPUs drew for the pods (gpu_pod_energy_joules_total: "
            "a shared GPU's energy split by each pod's share of its use).",
            Query(f"sum({output}) / (sum({watts} and {output}) > 0)"),
            decimals=2,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Idle headroom per hour",
            "What the serving pods' GPUs cost per hour beyond the share they keep busy: "
            "allocation-basis minus usage-basis cost (pods whose busy share NVML gives).",
            Query(f"sum({price} and {busy_price}) - sum({busy_price})"),
            unit=USD_PER_HOUR,
            decimals=2,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "CO₂e per hour",
            "Grams of CO₂e an hour from the energy the selected workloads' GPUs draw for them, at "
            "the grid carbon intensity gpuscope is configured with (none: no data).",
            Query(f"sum(workload:gpu_co2e_grams:rate5m{{{workload_scope}}}) * 3600"),
            unit="massg",
            decimals=0,
        ),
    )

    layout.row("By workload and model")
    layout.add(
        24,
        8,
        table(
            "Serving workloads",
            "Per workload and served model (vLLM's model_name, Triton's model; none for TGI): GPU "
            "cost per million output tokens, per million tokens and per thousand requests, on the "
            "allocation basis and (per million tokens) the usage basis, throughput, GPUs held, "
            "tokens per joule and requests per kWh. Empty where the server counts no tokens "
            "(Triton) or did nothing in the last 5 minutes.",
            ("namespace", "workload", "workload_kind", "model"),
            Column(
                "$ / M output tokens",
                f"workload:gpu_cost_usd_per_million_output_tokens{{{scope}}}",
                "currencyUSD",
            ),
            Column(
                "$ / M tokens",
                f"workload:gpu_cost_usd_per_million_tokens{{{scope}}}",
                "currencyUSD",
            ),
            Column(
                "$ / M tokens (usage)",
                f"workload:gpu_usage_cost_usd_per_million_tokens{{{scope}}}",
                "currencyUSD",
            ),
            Column(
                "$ / 1k requests",
                f"workload:gpu_cost_usd_per_thousand_requests{{{scope}}}",
                "currencyUSD",
            ),
            Column("Output tokens / s", output),
            Column("Requests / s", f"workload_model:serving_requests:rate5m{{{scope}}}", "reqps"),
            Column("GPUs held", held),
            Column("Tokens / J", f"workload:output_tokens_per_joule{{{scope}}}"),
            Column("Requests / kWh", f"workload:requests_per_kwh{{{scope}}}"),
            sort_by="$ / M output tokens",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Cost per million output tokens",
            "Allocation-basis GPU cost per million generated tokens, by workload and served model.",
            Query(f"workload:gpu_cost_usd_per_million_output_tokens{{{scope}}}", by_model),
            unit="currencyUSD",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Usage vs allocation cost per million tokens",
            "Cost per million tokens on the GPUs held (solid) and on the share of them the pods "
            "kept busy (dashed): the gap is idle headroom.",
            Query(f"workload:gpu_cost_usd_per_million_tokens{{{scope}}}", f"{by_model} allocation"),
            Query(
                f"workload:gpu_usage_cost_usd_per_million_tokens{{{scope}}}",
                f"{by_model} usage",
            ),
            unit="currencyUSD",
            overrides=(dashed(".* usage$"),),
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Output tokens / s per GPU",
            "Tokens generated a second per GPU held, by workload and served model.",
            Query(f"{output} / ({held} > 0)", by_model),
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Output tokens per joule",
            "Tokens generated per joule of GPU energy drawn for the workload's pods.",
            Query(f"workload:output_tokens_per_joule{{{scope}}}", by_model),
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Cost per thousand requests",
            "Allocation-basis GPU cost per thousand successful requests (every server, Triton "
            "included).",
            Query(f"workload:gpu_cost_usd_per_thousand_requests{{{scope}}}", by_model),
            unit="currencyUSD",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Requests per kWh",
            "Successful requests per kWh of GPU energy drawn for the workload's pods.",
            Query(f"workload:requests_per_kwh{{{scope}}}", by_model),
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Idle headroom per hour, by workload",
            "Allocation-basis minus usage-basis GPU cost per hour: what the serving capacity "
            "nobody keeps busy costs.",
            Query(
                f"sort_desc(sum by (namespace, workload) ({price} - {busy_price}))",
                "{{namespace}}/{{workload}}",
            ),
            unit=USD_PER_HOUR,
        ),
    )

    layout.row("By revision")
    by_revision = "{{namespace}}/{{workload}} {{revision}}"
    layout.add(
        12,
        8,
        timeseries(
            "Cost per million tokens, by revision",
            "Allocation-basis GPU cost per million tokens of each revision's pods (pod-template-"
            "hash or controller-revision-hash): a rollout shows as a new line beside the old.",
            Query(
                f"workload_revision:gpu_cost_usd_per_million_tokens:rate5m{{{workload_scope}}}",
                by_revision,
            ),
            unit="currencyUSD",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "GPU-busy seconds per request, by revision",
            "GPU time each request takes on each revision's pods: their busy GPU-seconds over "
            "their successful requests.",
            Query(
                f"workload_revision:gpu_busy_seconds_per_request:rate5m{{{workload_scope}}}",
                by_revision,
            ),
            unit="s",
        ),
    )
    layout.add(
        12,
        8,
        table(
            "Revisions",
            "Each serving revision: its pods, and the medians over its last hour serving that "
            "GpuServingRevisionRegressed compares.",
            ("namespace", "workload", "workload_kind", "revision"),
            Column(
                "Pods",
                "count by (namespace, workload, workload_kind, revision) "
                f"(pod_revision:gpu_pod_info:serving{{{workload_scope}}})",
            ),
            Column(
                "$ / M tokens (median 1 h)",
                f"workload_revision:gpu_cost_usd_per_million_tokens:median1h{{{workload_scope}}}",
                "currencyUSD",
            ),
            Column(
                "GPU-s / request (median 1 h)",
                f"workload_revision:gpu_busy_seconds_per_request:median1h{{{workload_scope}}}",
                "s",
            ),
            sort_by="Pods",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "CO₂e per hour, by workload",
            "Grams of CO₂e an hour from the GPU energy drawn for each workload's pods, at the "
            "configured grid carbon intensity (stacked).",
            Query(
                f"workload:gpu_co2e_grams:rate5m{{{workload_scope}}} * 3600",
                "{{namespace}}/{{workload}}",
            ),
            unit="massg",
            stack=True,
        ),
    )

    return dashboard(
        "gpuscope-serving",
        "gpuscope / Serving efficiency",
        "What each token and request costs in GPU money and energy, per workload, served model "
        "and revision: inference servers' own counters (vLLM, SGLang, TGI, Triton) joined to "
        "what the pods' GPUs cost, how busy they keep them and the energy drawn for them.",
        [
            query_variable(
                "namespace", "Namespace", "workload_model:gpu_allocation:share_sum", "namespace"
            ),
            query_variable(
                "workload",
                "Workload",
                'workload_model:gpu_allocation:share_sum{namespace=~"$namespace"}',
                "workload",
            ),
            query_variable(
                "model",
                "Served model",
                'workload_model:gpu_allocation:share_sum{namespace=~"$namespace", '
                'workload=~"$workload"}',
                "model",
            ),
        ],
        layout,
        annotations=(rollout_annotation(workload_scope),),
    )
