"""The API calls of `exporter.actions`, one at a time in the `gpuscope-kube-writes` daemon thread
(urllib3 blocks; a call that hangs past its timeouts cannot hold the process's exit). The client
is that thread's alone; each call's outcome comes back to the loop through its future."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from exporter.attribution.cluster import MAX_OBJECT_BYTES, KubernetesClient
from exporter.supervise import DaemonExecutor

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.attribution.cluster import ApiConfig
    from exporter.attribution.jsonstream import Shape

TIMEOUT_SECONDS: Final = (5.0, 10.0)
"""Connect, then read: a write the API server does not answer by then is retried later."""
STRATEGIC_MERGE: Final = "application/strategic-merge-patch+json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON: Final = "application/json"


class ApiWrites:
    """GETs and writes to the API server, awaited on the loop, made in one thread of their own."""

    def __init__(self, configuration: ApiConfig) -> None:
        self._client = KubernetesClient(configuration)
        self._thread = DaemonExecutor("gpuscope-kube-writes")

    async def get(self, path: str, shape: Shape) -> object:
        """What `shape` keeps of the object at `path`; raises as `KubernetesClient.get` does."""

        def get() -> object:
            return self._client.get_object(
                path, shape, limit=MAX_OBJECT_BYTES, timeout=TIMEOUT_SECONDS
            )

        return await asyncio.wrap_future(self._thread.submit(get))

    async def send(
        self, method: str, path: str, body: Mapping[str, object], *, content_type: str
    ) -> None:
        """`method` of `body` to `path`; raises `ApiError` for a refusal, `CredentialError`,
        and urllib3's errors for a connection that fails."""

        def send() -> None:
            self._client.send(
                method, path, body, content_type=content_type, timeout=TIMEOUT_SECONDS
            )

        await asyncio.wrap_future(self._thread.submit(send))

    def close(self) -> None:
        self._thread.submit(self._client.close)
        self._thread.shutdown(wait=False)
