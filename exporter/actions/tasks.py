"""The background tasks of `--kubernetes.node-condition` and `--kubernetes.events`, started by
the app after sampling and stopped before it; each restarted with backoff if it fails
(`exporter.supervise`), its health reported as a collector (`node_condition`, `pod_events`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from exporter.actions.condition import NodeCondition
from exporter.actions.recorder import EventRecorder, PodEvents
from exporter.actions.writes import ApiWrites
from exporter.supervise import background_task, supervised

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from exporter.attribution import ClusterAccess
    from exporter.config import ServeConfig
    from exporter.model import Snapshot
    from exporter.supervise import TaskHealth

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def running(
    config: ServeConfig,
    cluster: ClusterAccess | None,
    latest: Callable[[], Snapshot | None],
    healths: dict[str, TaskHealth],
) -> AsyncIterator[None]:
    """The tasks `healths` names, while in the block; none without a cluster."""
    if not healths or cluster is None:
        yield
        return
    writes = ApiWrites(cluster.configuration)
    tasks: list[asyncio.Task[None]] = []
    if "node_condition" in healths:
        condition = NodeCondition(
            writes, cluster.node_name, latest, recovery_seconds=config.node_condition_recovery
        )
        tasks.append(
            background_task(
                supervised(healths["node_condition"], condition.run),
                name="gpuscope-node-condition",
            )
        )
        log.info(
            "keeping the GPUHealthy node condition",
            extra={"node": cluster.node_name, "recovery_seconds": config.node_condition_recovery},
        )
    if "pod_events" in healths:
        events = PodEvents(
            EventRecorder(writes, cluster.node_name), latest, idle_after=config.events_idle_after
        )
        tasks.append(
            background_task(
                supervised(healths["pod_events"], events.run), name="gpuscope-pod-events"
            )
        )
        log.info("recording Events on pods", extra={"idle_after_seconds": config.events_idle_after})
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writes.close()
