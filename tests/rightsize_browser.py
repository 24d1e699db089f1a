"""A real page in headless Chromium, driven over the DevTools protocol (a websocket, aiohttp):
navigate, run the page's own script by clicking and typing as a user does, read the DOM, take a
screenshot. Used to test the report server's page and to draw the README's picture of it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import math
import struct
import subprocess
import threading
import urllib.request
from typing import TYPE_CHECKING, Any

import aiohttp

from tests.helpers import eventually, require_tool

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

WIDTH, HEIGHT = 1400, 1500


class Page:
    """One browser tab. Every call waits for Chromium's answer (at most `timeout` seconds)."""

    def __init__(self, websocket_url: str, *, timeout: float = 60.0) -> None:
        self._timeout = timeout
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cdp", daemon=True)
        self._thread.start()
        self._session, self._socket = self._run(self._connect(websocket_url))

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self._timeout)

    @staticmethod
    async def _connect(url: str) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
        session = aiohttp.ClientSession()
        return session, await session.ws_connect(url, max_msg_size=64 * 1024 * 1024)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        await self._socket.send_str(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(await self._socket.receive_str())
            if message.get("id") != number:
                continue  # an event, or an answer to nobody
            if "error" in message:
                raise AssertionError(f"{method}: {message['error']}")
            result: dict[str, Any] = message.get("result", {})
            return result

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._call(method, params))
        return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        eventually(
            lambda: self.evaluate("document.readyState === 'complete' && location.href") == url,
            30,
            f"{url} to load",
        )

    def click(self, selector: str) -> None:
        """A mouse click in the middle of the element, as a user makes it."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def type(self, selector: str, text: str) -> None:
        """Focus a field and type into it, as a keyboard does."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def clear(self, selector: str) -> None:
        """Empty a text field, as selecting its text and deleting it does."""
        self.evaluate(
            f"(() => {{ const f = document.querySelector({json.dumps(selector)});"
            " f.value = ''; f.dispatchEvent(new Event('input')); })()"
        )

    def choose(self, selector: str, value: str) -> None:
        """Pick an option of a <select> (a native popup CDP cannot open) and fire its change."""
        self.evaluate(
            f"(() => {{ const s = document.querySelector({json.dumps(selector)});"
            f" s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()"
        )

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def whole_page_screenshot(self, path: Path) -> tuple[int, int]:
        """A screenshot of everything the page lays out, beyond the window too: as wide as its
        content (wider than the window when something overflows it). Its size in pixels."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        width, height = math.ceil(size["width"]), math.ceil(size["height"])
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        )
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        png_width, png_height = struct.unpack(">II", data[16:24])
        return png_width, png_height

    def element_screenshot(self, selector: str, path: Path, *, margin: int = 8) -> None:
        """A screenshot of one element and `margin` pixels around it, wherever it is laid out."""
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect();"
            " return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()"
        )
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={
                "x": max(0, box[0] - margin),
                "y": max(0, box[1] - margin),
                "width": box[2] + 2 * margin,
                "height": box[3] + 2 * margin,
                "scale": 1,
            },
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        async def close() -> None:
            await self._socket.close()
            await self._session.close()

        with contextlib.suppress(Exception):
            self._run(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@contextlib.contextmanager
def browser(scratch: Path, *, width: int = WIDTH, height: int = HEIGHT) -> Iterator[Page]:
    """Headless Chromium with its DevTools on a loopback port of its choosing; one page."""
    profile = scratch / "chromium-cdp"
    process = subprocess.Popen(
        [
            require_tool("chromium"),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    page: Page | None = None
    try:
        active = profile / "DevToolsActivePort"
        port = eventually(
            lambda: active.exists() and active.read_text().split("\n")[0].strip(),
            60,
            "Chromium's DevTools port",
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            targets = json.load(answer)
        (tab,) = [target for target in targets if target["type"] == "page"]
        page = Page(tab["webSocketDebuggerUrl"])
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        yield page
    finally:
        if page is not None:
            page.close()
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
