"""Test-wide options and fixtures."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.fake_nvml import build_fake_nvml
from tests.served_app import AppClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

    from exporter.app import App


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden /metrics files from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def fake_lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake libnvidia-ml.so.1, compiled against the real nvml.h."""
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
async def app_client() -> AsyncIterator[Callable[[App], Awaitable[AppClient]]]:
    """Serves an `App` on a loopback port for the test: `client = await app_client(App(...))`;
    stopped at the end."""
    started: list[AppClient] = []

    async def start(app: App) -> AppClient:
        client = await AppClient(app).start()
        started.append(client)
        return client

    yield start
    for client in started:
        await client.close()
