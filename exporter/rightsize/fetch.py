"""Asking Prometheus for the usage history: every signal's query over the window, the
strategy's signals again over each shorter term, and the history assembled from the answers.

One cheap query goes first, so an unreachable or unauthorized server is one clear error; the
`held` signal says which pods held GPUs, and the per-pod signals (cAdvisor, kube-state-metrics)
are then asked about those pods only, in batches. A failed required signal fails the report, a
failed optional one costs only its own fields, and a term's query that fails costs only that
term. Whatever the source, OpenCost's GPU prices for the nodes of the GPUs held are read last
(`opencost.py`). Once per run the job also reads which GPU resource names the cluster's pods hold
(`gpu_allocation_info{resource}`: the names a patch must use) and kube-state-metrics'
HorizontalPodAutoscalers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.rightsize.dcgm_history import fetch_dcgm, source_of_history
from exporter.rightsize.history import LONG_TERM, TERMS, History, assemble
from exporter.rightsize.opencost import node_prices
from exporter.rightsize.prometheus import PrometheusQueryError
from exporter.rightsize.signals import SIGNALS, Signal, pod_batches, render
from exporter.rightsize.terms import Answers, ask_terms, with_terms

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from exporter.rightsize.history import Term
    from exporter.rightsize.prometheus import PrometheusClient, Sample
    from exporter.rightsize.selection import Selection

# The logger the history's queries have always logged under: filters on it keep matching.
log = logging.getLogger("exporter.rightsize.history")


async def fetch(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None = None,
    terms: Sequence[Term] = TERMS,
    source: str = "gpuscope",
) -> History:
    """Run every signal's query over the window, and the strategy's over each shorter term
    (concurrency bounded by the client), and assemble the history. `source` is whose series:
    `gpuscope`'s, `dcgm-exporter`'s (`dcgm_history.py`), or `auto` (whichever the window has)."""
    if source == "auto":
        await client.query("vector(1)", at=end, name="connectivity check")
        source = await source_of_history(client, end=end, window=window)
    read = fetch_dcgm if source == "dcgm-exporter" else _fetch_gpuscope
    history = await read(
        client,
        selection=selection,
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        cluster_label=cluster_label,
        terms=terms,
    )
    prices = await node_prices(
        client, source=history.source, end=end, window=window, cluster_label=cluster_label
    )
    return replace(history, node_prices=prices)


async def _fetch_gpuscope(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None,
    terms: Sequence[Term],
) -> History:
    """gpuscope's own series over the window and each shorter term."""

    async def ask(seconds: float, name: str) -> tuple[Answers, list[str]]:
        return await _ask_window(
            client,
            [s for s in SIGNALS if s.per_term or name == LONG_TERM],
            selection=selection,
            end=end,
            window=seconds,
            step=step,
            quantile=quantile,
            cluster_label=cluster_label,
            term=name,
        )

    asked = await ask_terms(client, ask, end=end, window=window, step=step, terms=terms)
    history = assemble(
        asked.answers,
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        missing_signals=asked.missing,
        cluster_label=cluster_label,
    )
    return with_terms(
        history,
        asked,
        lambda term, answers: (
            assemble(
                answers,
                end=end,
                window=term.seconds,
                step=step,
                quantile=quantile,
                cluster_label=cluster_label,
            ).workloads
        ),
    )


async def _ask_window(
    client: PrometheusClient,
    signals: list[Signal],
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None,
    term: str,
) -> tuple[dict[str, list[Sample]], list[str]]:
    """The answers of `signals` over one window, by name, and the optional ones that failed."""
    suffix = "" if term == LONG_TERM else f" ({term})"

    async def ask(
        signal: Signal, pods: Collection[tuple[str, str]] | None = None
    ) -> list[Sample] | None:
        """`signal`'s answer (about `pods` only, for a per-pod one)."""
        promql = render(
            signal,
            selection=selection,
            window=window,
            step=step,
            quantile=quantile,
            pods=pods or (),
            cluster_label=cluster_label,
        )
        asked = frozenset(pods) if pods is not None else None

        def keep(labels: Mapping[str, str]) -> bool:
            # A server answering every batch with every series costs no more than the batch.
            return asked is None or (labels.get("namespace", ""), labels.get("pod", "")) in asked

        try:
            return await client.query(
                promql,
                at=end,
                name=signal.name + suffix,
                keep=keep if asked is not None else None,
                bounds=signal.bounds(window, step),
                signal=signal.name,
            )
        except PrometheusQueryError as error:
            if signal.required:
                raise
            log.warning(
                "optional signal unavailable",
                extra={"signal": signal.name + suffix, "error": str(error)},
            )
            return None

    device_signals = [signal for signal in signals if not signal.per_pod]
    pod_signals = [signal for signal in signals if signal.per_pod]
    held_signal, *other_signals = device_signals
    device_answers = asyncio.gather(*(ask(signal) for signal in other_signals))
    try:
        held = await ask(held_signal)
    except BaseException:
        # The report cannot be made: stop the other queries rather than leave them running.
        device_answers.cancel()
        await asyncio.gather(device_answers, return_exceptions=True)
        raise
    pods = {
        pair
        for s in held or ()
        if _expressible(pair := (s.labels.get("namespace", ""), s.labels.get("pod", "")))
    }
    batches = pod_batches(pods)

    async def ask_batched(signal: Signal) -> list[Sample] | None:
        """A per-pod signal over every batch of pods; None if any batch failed."""
        answers = await asyncio.gather(*(ask(signal, batch) for batch in batches))
        if any(answer is None for answer in answers):
            return None
        return [sample for answer in answers for sample in answer or ()]

    pod_answers = await asyncio.gather(*(ask_batched(signal) for signal in pod_signals if pods))
    answers = {held_signal.name: held}
    answers.update(zip([s.name for s in other_signals], await device_answers, strict=True))
    answers.update(zip([s.name for s in pod_signals if pods], pod_answers, strict=True))
    missing = [name for name, samples in answers.items() if samples is None]
    return {name: samples or [] for name, samples in answers.items()}, missing


def _expressible(pair: tuple[str, str]) -> bool:
    """Whether a (namespace, pod) can be named in a PromQL string: UTF-8 text (a JSON answer
    can hold a lone surrogate, which no query can name)."""
    try:
        "".join(pair).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
