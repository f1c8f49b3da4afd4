"""Which workers exist: a static list, or the ready endpoints of a Kubernetes Service.

Discovery only says which workers *exist*; whether one is routable is the ingestion's call
(`agentserve.router.ingest.Fleet`: ready, publishing, resynced). Every source produces the same
value, a mapping of worker id → `WorkerEndpoint`, and the fleet applies the difference.

- **Static** (`workers:` URLs): the id is the URL. The KV event endpoint is read from the worker's
  `GET /info` (`kv_events_endpoint`); a worker bound to a wildcard address (`tcp://0.0.0.0:5557`)
  is reached at the host of its URL (`kv_endpoint_for`).
- **Kubernetes** (`discovery: kubernetes`): the EndpointSlices labelled
  `kubernetes.io/service-name=<worker_service>` in `namespace`, listed then watched
  (`discovery.k8s.io/v1`), so scaling the worker Deployment needs no router restart. Only ready
  endpoints count (`conditions.ready` true or unset, as the API asks consumers to read unset).
  The id is the pod name (`targetRef.name`), else the address; the URL and KV endpoint use the
  slice's ports named `http` and `kv-events` (the operator's worker Service names them so).

The slice arithmetic is pure (`SliceSet`); `KubeWatcher` is the I/O edge around the official
kubernetes client, whose blocking list/watch runs on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("agentserve.router")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
HTTP_PORT_NAME = "http"
KV_PORT_NAME = "kv-events"
_WILDCARDS = {"", "*", "0.0.0.0", "::", "[::]"}


@dataclass(frozen=True, slots=True)
class WorkerEndpoint:
    id: str
    url: str  # http://host:port of the worker's generate API
    kv_endpoint: str | None = None  # tcp://host:port of its KV events; None: ask its /info


# -- static ----------------------------------------------------------------------------------------


def static_endpoints(urls: Iterable[str]) -> dict[str, WorkerEndpoint]:
    out: dict[str, WorkerEndpoint] = {}
    for raw in urls:
        url = raw.strip().rstrip("/")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:  # not a number
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise ValueError(f"a worker is http://host:port, not {raw!r}")
        out[url] = WorkerEndpoint(url, url)
    return out


def kv_endpoint_for(worker_url: str, advertised: str) -> str:
    """The KV endpoint to connect to, from the one a worker advertises in /info."""
    parts = urlsplit(advertised)
    if parts.scheme != "tcp" or parts.port is None:
        raise ValueError(f"a KV events endpoint is tcp://host:port, not {advertised!r}")
    host = parts.hostname or ""
    if host in _WILDCARDS or parts.netloc.startswith("*"):
        host = urlsplit(worker_url).hostname or "127.0.0.1"
    return f"tcp://{_bracket(host)}:{parts.port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- Kubernetes EndpointSlices (pure) --------------------------------------------------------------


def endpoints_of_slice(
    eps: Mapping[str, Any], http_port: str = HTTP_PORT_NAME, kv_port: str = KV_PORT_NAME
) -> dict[str, WorkerEndpoint]:
    """The ready workers one EndpointSlice (as the API's JSON) lists."""
    ports = {p.get("name"): p.get("port") for p in eps.get("ports") or [] if isinstance(p, Mapping)}
    port, kv = ports.get(http_port), ports.get(kv_port)
    if not isinstance(port, int):
        return {}
    out: dict[str, WorkerEndpoint] = {}
    for endpoint in eps.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        addresses = endpoint.get("addresses") or []
        if not addresses:
            continue
        host = _bracket(str(addresses[0]))
        ref = endpoint.get("targetRef") or {}
        worker = str(ref.get("name") or addresses[0])
        kv_endpoint = f"tcp://{host}:{kv}" if isinstance(kv, int) else None
        out[worker] = WorkerEndpoint(worker, f"http://{host}:{port}", kv_endpoint)
    return out


class SliceSet:
    """The current EndpointSlices of one Service, updated by list and watch events."""

    def __init__(self, http_port: str = HTTP_PORT_NAME, kv_port: str = KV_PORT_NAME) -> None:
        self.http_port = http_port
        self.kv_port = kv_port
        self._slices: dict[str, dict[str, WorkerEndpoint]] = {}

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list: forget slices it does not contain."""
        self._slices = {_name(s): endpoints_of_slice(s, self.http_port, self.kv_port) for s in items}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event: ADDED, MODIFIED or DELETED (BOOKMARK and others change nothing)."""
        if kind in ("ADDED", "MODIFIED"):
            self._slices[_name(obj)] = endpoints_of_slice(obj, self.http_port, self.kv_port)
        elif kind == "DELETED":
            self._slices.pop(_name(obj), None)

    def endpoints(self) -> dict[str, WorkerEndpoint]:
        # A pod listed by two slices (dual stack) keeps the first slice's address, by slice name.
        out: dict[str, WorkerEndpoint] = {}
        for name in sorted(self._slices):
            for worker, endpoint in self._slices[name].items():
                out.setdefault(worker, endpoint)
        return out


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@dataclass(frozen=True, slots=True)
class Diff:
    added: tuple[WorkerEndpoint, ...]
    removed: tuple[str, ...]
    changed: tuple[WorkerEndpoint, ...]  # same id, new address: reconnect

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff(old: Mapping[str, WorkerEndpoint], new: Mapping[str, WorkerEndpoint]) -> Diff:
    return Diff(
        tuple(e for w, e in new.items() if w not in old),
        tuple(w for w in old if w not in new),
        tuple(e for w, e in new.items() if w in old and old[w] != e),
    )


# -- Kubernetes edge -------------------------------------------------------------------------------


class KubeWatcher:
    """Lists, then watches, a Service's EndpointSlices; calls `on_change` with every new worker set.

    The kubernetes client blocks, so the loop runs on a daemon thread and hands results to the
    event loop. A watch that expires (410 Gone) or breaks is followed by a fresh list after
    `retry_s`; `aclose` stops the watch by shutting its socket.
    """

    def __init__(
        self,
        namespace: str,
        service: str,
        on_change: Callable[[dict[str, WorkerEndpoint]], None],
        *,
        api_client: Any = None,
        watch_timeout_s: int = 300,
        retry_s: float = 2.0,
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.lists = 0  # how many times the slices were listed (tests, logs)
        self._api_client = api_client
        self._slices = SliceSet()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)
        self._thread.start()

    async def aclose(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)

    # -- thread ------------------------------------------------------------------------------------

    def _api(self) -> Any:
        client: Any = importlib.import_module("kubernetes.client")
        if self._api_client is None:
            config: Any = importlib.import_module("kubernetes.config")
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api_client = client.ApiClient()
        return client.DiscoveryV1Api(self._api_client)

    def _run(self) -> None:
        import json

        watch_mod: Any = importlib.import_module("kubernetes.watch")
        api = self._api()
        selector = f"{SERVICE_NAME_LABEL}={self.service}"
        while not self._stop.is_set():
            try:
                resp = api.list_namespaced_endpoint_slice(
                    self.namespace, label_selector=selector, _preload_content=False
                )
                listed = json.loads(resp.data)
                self.lists += 1
                self._slices.replace(listed.get("items") or [])
                self._publish()
                version = (listed.get("metadata") or {}).get("resourceVersion")
                self._watch = watch_mod.Watch()
                for event in self._watch.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    resource_version=version,
                    timeout_seconds=self.watch_timeout_s,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                ):
                    if self._stop.is_set():
                        break
                    obj = event.get("object")
                    if isinstance(obj, Mapping):
                        self._slices.apply(str(event.get("type")), obj)
                        self._publish()
                # The server ended the watch (timeout): list again, which also heals missed events.
            except Exception as exc:  # the API is unreachable, 410 Gone, or an unexpected reply
                if self._stop.is_set():
                    break
                log.warning("EndpointSlice watch of %s/%s failed: %s", self.namespace, self.service, exc)
                self._stop.wait(self.retry_s)

    def _publish(self) -> None:
        endpoints = self._slices.endpoints()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self.on_change, endpoints)
