"""The window and each shorter term asked together, whatever the history's source.

One cheap query goes first, so an unreachable or unauthorized server is one clear error, not
dozens of parallel ones. The shorter terms are asked concurrently with the whole window (the
client bounds the concurrency); a term whose query fails costs only that term, which the history
then lists in `missing_signals`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

from exporter.rightsize.history import LONG_TERM, TermHistory
from exporter.rightsize.prometheus import PrometheusQueryError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from exporter.rightsize.history import History, Term, WorkloadHistory
    from exporter.rightsize.prometheus import PrometheusClient, Sample

# The logger the history's queries have always logged under: filters on it keep matching.
log = logging.getLogger("exporter.rightsize.history")

Answers: TypeAlias = dict[str, list["Sample"]]
"""Each signal's samples, by signal name."""


@dataclass(frozen=True, slots=True)
class Asked:
    """The answers over the whole window, and over each shorter term that could be read."""

    answers: Answers
    missing: tuple[str, ...]
    """Optional signals whose query over the window failed."""
    terms: tuple[tuple[Term, Answers], ...]
    lost: tuple[str, ...]
    """Terms whose query failed."""


async def ask_terms(
    client: PrometheusClient,
    ask: Callable[[float, str], Awaitable[tuple[Answers, list[str]]]],
    *,
    end: float,
    window: float,
    step: float,
    terms: Sequence[Term],
) -> Asked:
    """`ask(seconds, term name)` over the window and over each term at least two steps long and
    shorter than the window."""
    await client.query("vector(1)", at=end, name="connectivity check")
    shorter = [term for term in terms if 2 * step <= term.seconds < window]

    async def ask_term(term: Term) -> Answers | None:
        try:
            answers, _ = await ask(term.seconds, term.name)
        except PrometheusQueryError as error:
            log.warning("term unavailable", extra={"term": term.name, "error": str(error)})
            return None
        return answers

    term_answers = asyncio.gather(*(ask_term(term) for term in shorter))
    try:
        answers, missing = await ask(window, LONG_TERM)
    except BaseException:
        # The history cannot be read: stop the terms' queries rather than leave them running.
        term_answers.cancel()
        await asyncio.gather(term_answers, return_exceptions=True)
        raise
    read: list[tuple[Term, Answers]] = []
    lost: list[str] = []
    for term, found in zip(shorter, await term_answers, strict=True):
        if found is None:
            lost.append(term.name)
        else:
            read.append((term, found))
    return Asked(answers, tuple(missing), tuple(read), tuple(lost))


def with_terms(
    history: History,
    asked: Asked,
    workloads: Callable[[Term, Answers], Iterable[WorkloadHistory]],
) -> History:
    """`history` with each term's workloads (`workloads(term, its answers)`), and the terms that
    could not be read listed among its missing signals."""
    return replace(
        history,
        missing_signals=(*history.missing_signals, *asked.lost),
        terms=tuple(
            TermHistory(
                term.name, term.seconds, {w.configuration: w for w in workloads(term, answers)}
            )
            for term, answers in asked.terms
        ),
    )
