"""Reading the fleet over the network: which pods exist, and what they report.

Endpoints come from static URLs or, on Kubernetes, from the ready endpoints of the worker, frontend
and router Services' EndpointSlices (`SliceSet`, the router's own discovery arithmetic). Each
interval the planner fetches every worker's `GET /load` (JSON `Load`), every frontend's and router's
`GET /metrics` (Prometheus text) concurrently, with a short timeout: a pod that does not answer is
left out of this reading and named in `FleetReading.unreachable`.

`Fetch` is the one seam: the default reads HTTP with the standard library on a thread (the planner
makes a handful of requests per interval; no client pool is worth a dependency).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from agentserve.planner.readings import Reading, parse_frontend_metrics, parse_router_queue
from agentserve.router.discovery import SliceSet, WorkerEndpoint, static_endpoints
from agentserve.worker.engine import Load

FETCH_TIMEOUT_S = 2.0
Fetch = Callable[[str], Awaitable[bytes]]  # GET url → body; raises on failure or a non-200 status
Discover = Callable[[str], Awaitable[dict[str, WorkerEndpoint]]]  # role → ready endpoints by id
ROLES = ("worker", "frontend", "router")
_LOAD_FIELDS = frozenset(f.name for f in fields(Load))


async def http_get(url: str) -> bytes:
    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return bytes(response.read())

    return await asyncio.to_thread(get)


def load_of(body: bytes) -> Load:
    """A worker's `/load` JSON → `Load` (fields this version does not know are ignored)."""
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("/load is not a JSON object")
    return Load(**{k: v for k, v in data.items() if k in _LOAD_FIELDS})


@dataclass(frozen=True, slots=True)
class FleetReading:
    loads: dict[str, Load]  # ready workers that answered, by pod (or URL)
    frontend: Reading | None  # the frontends' readings summed; None: none answered
    queued: int  # requests waiting in the routers' queues
    unreachable: tuple[str, ...]  # endpoints that did not answer (url)
    workers_discovered: int


def static_discovery(urls: Mapping[str, Sequence[str]]) -> Discover:
    endpoints = {role: static_endpoints(urls.get(role, ())) for role in ROLES}

    async def discover(role: str) -> dict[str, WorkerEndpoint]:
        return endpoints[role]

    return discover


def slice_discovery(
    list_slices: Callable[[str], list[dict[str, Any]]], services: Mapping[str, str | None]
) -> Discover:
    """Ready endpoints from the EndpointSlices of each role's Service (`list_slices` blocks)."""

    async def discover(role: str) -> dict[str, WorkerEndpoint]:
        service = services.get(role)
        if not service:
            return {}
        slices = SliceSet()
        slices.replace(await asyncio.to_thread(list_slices, service))
        return slices.endpoints()

    return discover


class FleetReader:
    def __init__(self, discover: Discover, fetch: Fetch = http_get) -> None:
        self.discover = discover
        self.fetch = fetch

    async def read(self) -> FleetReading:
        workers, frontends, routers = await asyncio.gather(*(self.discover(role) for role in ROLES))
        jobs = [
            *(self._get(e.url + "/load") for e in workers.values()),
            *(self._get(e.url + "/metrics") for e in frontends.values()),
            *(self._get(e.url + "/metrics") for e in routers.values()),
        ]
        bodies = await asyncio.gather(*jobs)
        unreachable: list[str] = []
        loads: dict[str, Load] = {}
        readings: list[Reading] = []
        queued = 0
        names = [*workers, *frontends, *routers]
        urls = [e.url for group in (workers, frontends, routers) for e in group.values()]
        for i, (name, url, body) in enumerate(zip(names, urls, bodies, strict=True)):
            try:
                if body is None:
                    raise ValueError("no answer")
                if i < len(workers):
                    loads[name] = load_of(body)
                elif i < len(workers) + len(frontends):
                    readings.append(parse_frontend_metrics(body.decode("utf-8", "replace")))
                else:
                    queued += parse_router_queue(body.decode("utf-8", "replace"))
            except (ValueError, TypeError):
                unreachable.append(url)
        return FleetReading(loads, Reading.total(readings), queued, tuple(unreachable), len(workers))

    async def _get(self, url: str) -> bytes | None:
        try:
            return await asyncio.wait_for(self.fetch(url), FETCH_TIMEOUT_S * 2)
        except (OSError, TimeoutError, ValueError):
            return None
