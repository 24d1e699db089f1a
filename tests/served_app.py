"""The daemon's application served in-process on a loopback port, with an aiohttp client to ask
it: what the in-process tests of the endpoints use (`app_client` in tests/conftest.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp

from exporter.web.server import Listener

if TYPE_CHECKING:
    from exporter.app import App

GRACE_SECONDS = 1.0


class AppClient:
    """An `App` started and listening on 127.0.0.1, and a client session for it."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.listener = Listener(app.handle, app.security.connections, app.security.ssl_context)
        self.session: aiohttp.ClientSession | None = None

    @property
    def port(self) -> int:
        return self.listener.addresses[0][1]

    async def start(self) -> AppClient:
        await self.app.start()
        await self.listener.start("127.0.0.1", 0)
        self.session = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{self.port}")
        return self

    async def request(self, method: str, path: str, **options: Any) -> aiohttp.ClientResponse:
        """One request, its body read (so that the connection goes back to the pool)."""
        assert self.session is not None
        response = await self.session.request(method, path, **options)
        await response.read()
        return response

    async def get(self, path: str, **options: Any) -> aiohttp.ClientResponse:
        return await self.request("GET", path, **options)

    async def head(self, path: str, **options: Any) -> aiohttp.ClientResponse:
        return await self.request("HEAD", path, **options)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.listener.stop(GRACE_SECONDS)
        await self.app.stop()
