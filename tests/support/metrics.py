"""Reading the daemon's /metrics in a test: one scrape parsed by prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from support.daemon import Bridge


async def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}) as resp:
        return resp.status, await resp.text()


class Samples:
    """One scrape of /metrics, parsed by prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.values[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.values.get((name, frozenset(labels.items())))

    def count(self, name: str, **labels: str) -> float:
        """A counter's value, 0 when the series was never created."""
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def label_values(self, label: str) -> set[str]:
        return {dict(labels)[label] for (_, labels) in self.values if label in dict(labels)}


async def scrape(b: Bridge, path: str = "/metrics") -> Samples:
    status, text = await http_get(b.base + path)
    assert status == 200, (status, text)
    return Samples(text)


async def scrape_until(b: Bridge, check: Callable[[Samples], bool], timeout: float = 5.0) -> Samples:
    """Bounded polling for a value that changes asynchronously; the last scrape if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        samples = await scrape(b)
        if check(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.05)
