"""What the daemon tells the cluster, only when asked to (`--kubernetes.node-condition`,
`--kubernetes.events`): a `GPUHealthy` condition on its own node and Events on the pods that
matter. Both read the snapshots the sampling loop publishes and nothing else of the daemon.

Modules: `xids` (which XIDs are fatal, and the new ones a snapshot shows), `health` (the node's
GPU health over time, pure), `condition` (the condition written by PATCH of the node's status),
`findings` (which pods get which Event, pure), `recorder` (Events built, deduplicated as
client-go's recorder does, and written), `writes` (the API calls, in a thread of their own),
`tasks` (the background tasks the app starts).

Threading: everything here runs on the event loop but the API calls, which run one at a time in
the `gpuscope-kube-writes` daemon thread and hand back their outcome through a future; the
snapshots read are immutable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.supervise import TaskHealth

if TYPE_CHECKING:
    from exporter.config import ServeConfig


def task_healths(config: ServeConfig) -> dict[str, TaskHealth]:
    """The health of each task the configuration asks for, by collector name (the tasks' modules
    are imported only when one is: they bring the API client)."""
    # `events` is the XID thread's collector already.
    names = [("node_condition", config.node_condition), ("pod_events", config.events)]
    return {name: TaskHealth(name) for name, wanted in names if wanted}
