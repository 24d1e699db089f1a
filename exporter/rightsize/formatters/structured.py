"""The structured formats, `json` and `yaml`: one document carrying everything in the report
(`report_document`), which every structured format reuses."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any, Final

import yaml

from exporter.durations import format_duration
from exporter.rightsize.formatters.common import TOKENS_NOTE, Format, Output, timestamp
from exporter.rightsize.replay.summary import simulation_document
from exporter.rightsize.settings import settings_text

if TYPE_CHECKING:
    from exporter.rightsize.hardware import Option
    from exporter.rightsize.patches import Patch
    from exporter.rightsize.report import Money, Report
    from exporter.rightsize.row import WorkloadRow


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _money(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _option(option: Option | None) -> dict[str, Any] | None:
    if option is None:
        return None
    return {
        "label": option.label,
        "model": option.model.name,
        "model_key": option.model.key,
        "mig_profile": option.mig_profile.profile if option.mig_profile else None,
        "shared_by": option.shared_by,
        "compute_fraction": round(option.compute, 4),
        "memory_bytes": option.memory_bytes,
    }


def _money_document(money: Money) -> dict[str, Any]:
    return {
        "cost_current_usd_per_month": _money(money.current),
        "cost_recommended_usd_per_month": _money(money.recommended),
        "savings_usd_per_month": _money(money.savings),
        "unpriced_workloads": money.unpriced,
    }


def patch_document(patch: Patch | None) -> dict[str, Any] | None:
    """A workload's patch: its owner object, the strategic-merge body, how to apply it."""
    if patch is None:
        return None
    return {
        "object": {
            "kind": patch.kind,
            "namespace": patch.namespace,
            "name": patch.name,
            **({"cluster": patch.cluster} if patch.cluster else {}),
        },
        "container": patch.container or None,
        "changes": list(patch.changes),
        "type": "strategic",
        "body": patch.body,
        "applies_live": patch.live,
        "file": patch.file if patch.body is not None else None,
        "command": shlex.join(patch.command()) if patch.body is not None else None,
        "note": patch.note or None,
    }


def _terms(row: WorkloadRow) -> dict[str, Any]:
    return {
        term.name: {
            "window": format_duration(term.window_seconds),
            "classification": term.recommendation.classification if term.recommendation else None,
            "recommended": term.label,
            "compute_fraction": _ratio(term.demand),
            "memory_peak_bytes": term.recommendation.demand.memory_bytes
            if term.recommendation and term.recommendation.demand
            else None,
        }
        for term in row.terms
    }


def workload_document(row: WorkloadRow) -> dict[str, Any]:
    recommendation = row.recommendation
    demand = recommendation.demand
    history = row.history
    confidence, trend, autoscaler = row.confidence, row.trend, row.autoscaler
    return {
        **({"cluster": history.cluster} if history.cluster else {}),
        "namespace": history.namespace,
        "kind": history.kind,
        "workload": history.name,
        "queue": {"name": history.queue, "kind": history.queue_kind} if history.queue else None,
        "pods": [pod.name for pod in history.pods],
        "replicas": row.replicas,
        "replicas_mean": round(row.replicas_mean, 3),
        "gpus_per_replica": row.gpus_per_replica,
        "autoscaler": None
        if autoscaler is None
        else {
            "name": autoscaler.name,
            "min_replicas": autoscaler.min_replicas,
            "max_replicas": autoscaler.max_replicas,
            "metrics": list(autoscaler.metrics),
        },
        "gpus_held": round(row.gpus_held, 3),
        "current": _option(recommendation.current),
        "usage": {
            "utilization_mean": _ratio(row.utilization_mean),
            "utilization_quantile": _ratio(row.utilization_quantile),
            "sm_active_quantile": _ratio(row.sm_quantile),
            "memory_peak_bytes": row.memory_peak_bytes,
            "memory_p99_bytes": row.memory_quantile_bytes,
            "idle_ratio": _ratio(row.idle_ratio),
            "cpu_usage_over_limit": _ratio(row.cpu_ratio),
            "shared": row.shared,
        },
        "classification": recommendation.classification,
        "action": recommendation.action,
        "reason": recommendation.reason,
        "confidence": row.confidence_level,
        "confidence_reason": confidence.reason if confidence else None,
        "trend": trend.direction if trend else None,
        "trend_reason": trend.reason if trend else None,
        "terms": _terms(row),
        "target": _option(recommendation.target) if recommendation.action == "move" else None,
        "recommended": row.target_label,
        "recommended_gpus": row.recommended_gpus,
        "demand": None
        if demand is None
        else {
            "compute_fraction": round(demand.compute, 4),
            "compute_signal": demand.compute_signal,
            "memory_bytes": demand.memory_bytes,
            "roofline_side": demand.roofline_side,
        },
        "cpu_changes": [
            {
                "pod": change.pod,
                "container": change.container,
                "usage_cores": round(change.usage_cores, 3),
                "limit_cores": change.limit_cores,
                "recommended_limit_cores": change.recommended_cores,
            }
            for change in recommendation.cpu_changes
        ],
        "cost_current_usd_per_month": _money(row.cost_current),
        "cost_recommended_usd_per_month": _money(row.cost_recommended),
        "price_source": row.price_source,
        "option_price_scale": round(row.option_price_scale, 4),
        "savings_usd_per_month": _money(row.savings),
        "cost_current_usd_per_month_per_replica": _money(row.cost_current_per_replica),
        "savings_usd_per_month_per_replica": _money(row.savings_per_replica),
        "tokens_per_month": None if row.tokens_per_month is None else round(row.tokens_per_month),
        "cost_current_usd_per_million_tokens": _ratio(row.cost_per_million_tokens_current),
        "cost_recommended_usd_per_million_tokens": _ratio(row.cost_per_million_tokens_recommended),
        "patch": patch_document(row.patch),
    }


def report_document(report: Report) -> dict[str, Any]:
    """Everything in the report as plain data (the json and yaml formats)."""
    consolidation = report.consolidation
    return {
        "generated_at": timestamp(report.end),
        "gpuscope_version": report.version,
        "source": report.source,
        "history_source": report.history_source,
        "window": format_duration(report.window_seconds),
        "step": format_duration(report.step_seconds),
        "strategy": report.strategy,
        "settings": settings_text(report.settings),
        "cluster_label": report.cluster_label,
        "min_confidence": report.min_confidence,
        "cost_per_million_tokens": TOKENS_NOTE,
        "summary": {
            "workloads": len(report.rows),
            "left_out_below_min_confidence": report.left_out,
            "classifications": report.classification_counts,
            "confidence": report.confidence_counts,
            **_money_document(report.total),
            "savings_usd_per_year": _money(report.total.savings * 12),
            "business_case": report.business_case,
        },
        "clusters": [
            {"cluster": cluster, **_money_document(money)} for cluster, money in report.clusters
        ],
        "namespaces": [
            {
                **({"cluster": entry.cluster} if report.cluster_label else {}),
                "namespace": entry.namespace,
                **_money_document(entry.money),
            }
            for entry in report.namespaces
        ],
        "queues": [
            {
                **({"cluster": entry.cluster} if report.cluster_label else {}),
                "queue": entry.queue,
                "queue_kind": entry.queue_kind or "none",
                **_money_document(entry.money),
            }
            for entry in report.queues
        ],
        "consolidation": {
            "gpus_before": consolidation.gpus_before,
            "gpus_after": consolidation.gpus_after,
            "utilization_before": _ratio(consolidation.utilization_before),
            "utilization_after": _ratio(consolidation.utilization_after),
            "models": [
                {
                    "model": change.model,
                    "gpus_before": change.gpus_before,
                    "gpus_after": change.gpus_after,
                    "utilization_before": _ratio(change.utilization_before),
                    "utilization_after": _ratio(change.utilization_after),
                }
                for change in consolidation.models
            ],
        },
        "workloads": [workload_document(row) for row in report.rows],
        "rooflines": [
            {
                "model": roofline.model,
                "dtype": roofline.dtype,
                "peak_flops": roofline.peak_flops.value,
                "peak_flops_source": roofline.peak_flops.source,
                "memory_bandwidth_bytes_per_second": roofline.bandwidth.value,
                "memory_bandwidth_source": roofline.bandwidth.source,
                "points": [
                    {
                        "workload": point.workload,
                        "classification": point.classification,
                        "intensity_flop_per_byte": round(point.intensity, 3),
                        "flops": point.flops,
                    }
                    for point in roofline.points
                ],
            }
            for roofline in report.rooflines
        ],
        "missing_signals": list(report.missing_signals),
        "simulation": simulation_document(report.simulation),
    }


def format_json(report: Report, _output: Output) -> str:
    return json.dumps(report_document(report), indent=2) + "\n"


def format_yaml(report: Report, _output: Output) -> str:
    return yaml.safe_dump(report_document(report), sort_keys=False, allow_unicode=True)


JSON: Final = Format("json", "json", format_json)
YAML: Final = Format("yaml", "yaml", format_yaml)
