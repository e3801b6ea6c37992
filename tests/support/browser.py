"""Headless Chromium, driven over the DevTools protocol (a WebSocket, through aiohttp).

`launch(tmp_path)` starts `chromium --headless` on an ephemeral loopback debugging
port with a throwaway profile and yields a `Page`: navigate, evaluate script, wait
for a condition, take a screenshot. It records every request the page made and
every console error, script exception and browser log error (CSP violations are
reported there), so a test can assert that nothing left loopback and nothing
went wrong. On exit the browser (and its process group) is stopped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._loaded: asyncio.Future[None] | None = None
        self.requests: list[str] = []
        self.errors: list[str] = []  # console errors, exceptions, CSP violations
        self.http_errors: list[str] = []  # 4xx and 5xx answers the browser logged
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            data = json.loads(msg.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    if "error" in data:
                        future.set_exception(RuntimeError(str(data["error"])))
                    else:
                        future.set_result(data.get("result", {}))
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Page.loadEventFired" and self._loaded is not None and not self._loaded.done():
                self._loaded.set_result(None)
            elif method == "Network.requestWillBeSent":
                self.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                self.errors.append("exception: " + json.dumps(params["exceptionDetails"])[:500])
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                # Chromium logs every 4xx answer to a fetch as an error; the page expects some (a 401 before sign-in).
                (self.http_errors if entry.get("source") == "network" else self.errors).append(entry["text"])

    async def send(self, method: str, **params: Any) -> Any:
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        await self._ws.send_str(json.dumps({"id": request_id, "method": method, "params": params}))
        async with asyncio.timeout(30):
            return await future

    async def navigate(self, url: str) -> None:
        """Open `url` and wait for its load event (its deferred scripts have run)."""
        self._loaded = asyncio.get_running_loop().create_future()
        await self.send("Page.navigate", url=url)
        async with asyncio.timeout(30):
            await self._loaded

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        """The first truthy value of `expression`, evaluated every 50 ms (the page updates itself
        on its own timer, which the test cannot hook into), within `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(0.05)
        return value

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    async def close(self) -> None:
        await self._ws.close()
        await self._reader


@contextlib.asynccontextmanager
async def launch(tmp_path: Path, width: int = 1280, height: int = 720) -> AsyncIterator[Page]:
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
        "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={width},{height}", "about:blank",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            while not (found := _LISTENING.search(await proc.stderr.readline())):
                if proc.returncode is not None:
                    raise AssertionError("chromium exited before listening")
        drain = asyncio.get_running_loop().create_task(_drain(proc.stderr))
        browser_url = found.group(1).decode()
        port = browser_url.split(":")[2].split("/")[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            page_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with http.ws_connect(page_url, max_msg_size=64 * 1024 * 1024) as ws:
                page = Page(ws)
                for domain in ("Page", "Runtime", "Network", "Log"):
                    await page.send(f"{domain}.enable")
                try:
                    yield page
                finally:
                    await page.close()
        drain.cancel()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read chromium's stderr to its end, so that it never blocks on a full pipe."""
    while await stream.read(65536):
        pass
