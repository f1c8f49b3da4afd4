"""The Kubernetes API at the operator's edge: the few calls the reconcile loop makes.

`Cluster` is the boundary the reconcile loop is written against; `KubeCluster` implements it with
plain REST calls through the official client's `ApiClient` (server-side apply with our field manager,
create-if-absent, list by label, delete, status patches, Events), resolving kinds to resources with
its own small discovery table. Every API failure surfaces as `ClusterError`, so callers handle one
exception type.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import quote

from agentserve.operator.build import MANAGED_BY
from agentserve.operator.reconcile import ObjectRef
from agentserve.operator.spec import API_VERSION, KIND

REQUEST_TIMEOUT_SECONDS = 30.0  # an API server that hangs must not hang the reconcile loop
Objects = list[dict[str, Any]]  # (a name of its own: `list` is also a method below)


class ClusterError(RuntimeError):
    """An API call failed (status is the HTTP status when there was a response)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KindNotInstalled(ClusterError):
    """The API does not serve this kind (e.g. ServiceMonitor without the prometheus-operator CRDs)."""


class Cluster(Protocol):
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply `obj` (force: the operator owns every field it sets)."""
        ...

    def create(self, obj: dict[str, Any]) -> bool:
        """Create `obj` if nothing of its name exists: True when created, False when one existed (left
        as it is). Needs only the `create` verb: the operator never reads what it creates this way."""
        ...

    def delete(self, ref: ObjectRef) -> None: ...

    def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str
    ) -> list[dict[str, Any]]: ...

    def get_owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The AgentServingDeployment `name`, or None when it is gone."""
        ...

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Write the CR's status by server-side apply under our field manager: the fields (and conditions,
        a list-map keyed by type) we set are ours; another writer's condition (the planner's
        `Autoscaling`) is left alone, however old the status we computed ours from."""
        ...

    def remove_condition(self, namespace: str, name: str, condition_type: str) -> None:
        """Remove one condition whoever wrote it (a JSON patch tested on its type: a list that moved
        since the read is a 422, not a wrong removal); nothing when it is not there."""
        ...

    def list_owners(self, namespaces: Sequence[str]) -> Objects:
        """Every AgentServingDeployment in `namespaces` (all namespaces when empty)."""
        ...

    def post_event(self, event: dict[str, Any]) -> None:
        """Create a core/v1 Event (what `kubectl describe` shows)."""
        ...

    def recheck(self, api_version: str) -> None:
        """Look a group-version found missing up again on the next call (a required kind)."""
        ...


class _Discovery:
    """Which resource (plural, namespaced) serves each kind, read from the API server per group-version.

    Not the kubernetes client's discovery cache (a mutable structure shared by threads and backed by a
    file in the temp dir, which raced here: `KeyError: 'resources'`): each group-version is read at most
    once, under a lock, into an immutable mapping. A group-version the server does not serve (an optional
    kind such as ServiceMonitor without the prometheus-operator) is asked again after `retry_seconds`, so
    installing its CRD later is noticed without a restart and without a lookup on every sync.
    """

    def __init__(self, fetch: Callable[[str], dict[str, Any] | None], retry_seconds: float = 60.0) -> None:
        self._fetch = fetch
        self._retry = retry_seconds
        self._lock = threading.Lock()
        self._served: dict[str, Mapping[str, tuple[str, bool]]] = {}
        self._missing: dict[str, float] = {}  # group-version → when it was found missing

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        kinds = self._served.get(api_version)
        if kinds is None:
            kinds = self._load(api_version)
        found = kinds.get(kind)
        if found is None:
            raise KindNotInstalled(f"{kind} ({api_version}) is not served by this cluster", 404)
        return found

    def recheck(self, api_version: str) -> None:
        """Ask for a group-version found missing on the next lookup, not after `retry_seconds`: a spec
        that cannot run without it (LeaderWorkerSet) should see it the moment it is installed."""
        with self._lock:
            self._missing.pop(api_version, None)

    def forget(self, api_version: str) -> None:
        """The server answered 404 for a whole collection: its CRD may be gone; read it again."""
        with self._lock:
            self._served.pop(api_version, None)

    def _load(self, api_version: str) -> Mapping[str, tuple[str, bool]]:
        with self._lock:
            if api_version in self._served:
                return self._served[api_version]
            missing_since = self._missing.get(api_version)
            if missing_since is not None and time.monotonic() - missing_since < self._retry:
                return {}
            listing = self._fetch(api_version)
            if listing is None:
                self._missing[api_version] = time.monotonic()
                return {}
            kinds = {
                str(r["kind"]): (str(r["name"]), bool(r.get("namespaced")))
                for r in listing.get("resources") or []
                if "/" not in str(r.get("name", ""))  # subresources (x/status) share the kind
            }
            self._missing.pop(api_version, None)
            self._served[api_version] = MappingProxyType(kinds)
            return self._served[api_version]


class KubeCluster:
    """`Cluster` over the official kubernetes client's `ApiClient` (in-cluster config, else kubeconfig).

    Requests are plain REST calls on paths built from `_Discovery`; the client's `DynamicClient` is not
    used (its discovery cache is what raced). Server-side apply uses our field manager and `force`.
    """

    def __init__(
        self,
        api_client: Any = None,
        field_manager: str = MANAGED_BY,
        missing_kind_retry_seconds: float = 60.0,
    ) -> None:
        # The client's typing varies by release: hold its modules as Any.
        config: Any = importlib.import_module("kubernetes.config")
        client: Any = importlib.import_module("kubernetes.client")
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._api: Any = api_client
        self._field_manager = field_manager
        self._discovery = _Discovery(self._group_version, missing_kind_retry_seconds)

    # -------------------------------------------------------------------------------- plumbing

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        api_exception: Any = importlib.import_module("kubernetes.client.exceptions").ApiException
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            request = self._api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*request, _request_timeout=REQUEST_TIMEOUT_SECONDS)
            data = response.read()
        except api_exception as exc:
            raise ClusterError(f"{exc.status} {exc.reason}: {exc.body}", exc.status) from exc
        except (OSError, ValueError) as exc:  # connection refused/reset, TLS, timeouts
            raise ClusterError(f"{method} {path}: {exc}") from exc
        except Exception as exc:  # urllib3's errors are not OSErrors: an outage is a ClusterError too
            if type(exc).__module__.startswith("urllib3"):
                raise ClusterError(f"{method} {path}: {exc}") from exc
            raise
        if not 200 <= response.status <= 299:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            raise ClusterError(f"{response.status} {response.reason}: {text}", response.status)
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise ClusterError(f"{method} {path}: not JSON: {exc}") from exc

    def _group_version(self, api_version: str) -> dict[str, Any] | None:
        try:
            listing = self.request("GET", _base(api_version))
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(listing) if isinstance(listing, dict) else None

    def _path(self, api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
        plural, namespaced = self._discovery.resource(api_version, kind)
        path = _base(api_version)
        if namespaced and namespace:
            path += f"/namespaces/{quote(namespace, safe='')}"
        path += f"/{plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
        return path

    # -------------------------------------------------------------------------------- the calls

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = self._path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        out = self.request(
            "PATCH",
            path,
            query=[("fieldManager", self._field_manager), ("force", "true")],
            body=obj,
            content_type="application/apply-patch+yaml",
        )
        return dict(out)

    def create(self, obj: dict[str, Any]) -> bool:
        path = self._path(obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace"))
        try:
            self.request(
                "POST",
                path,
                query=[("fieldManager", self._field_manager)],
                body=obj,
                content_type="application/json",
            )
        except ClusterError as exc:
            if exc.status == 409:  # AlreadyExists: the apiserver keeps the existing object untouched
                return False
            raise
        return True

    def delete(self, ref: ObjectRef) -> None:
        try:
            self.request(
                "DELETE",
                self._path(ref.api_version, ref.kind, ref.namespace, ref.name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
                content_type="application/json",
            )
        except ClusterError as exc:
            if exc.status != 404:
                raise

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._list(api_version, kind, namespace, label_selector)

    def _list(self, api_version: str, kind: str, namespace: str | None, label_selector: str = "") -> Objects:
        query = [("labelSelector", label_selector)] if label_selector else []
        try:
            out = self.request("GET", self._path(api_version, kind, namespace), query=query)
        except ClusterError as exc:
            if exc.status == 404:  # the collection itself is gone (its CRD was deleted)
                self._discovery.forget(api_version)
                raise KindNotInstalled(f"{kind} ({api_version}) is not served by this cluster", 404) from exc
            raise
        items: Objects = (out or {}).get("items") or []
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def list_owners(self, namespaces: Sequence[str]) -> Objects:
        if not namespaces:
            return self._list(API_VERSION, KIND, None)
        return [o for ns in namespaces for o in self._list(API_VERSION, KIND, ns)]

    def get_owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.request("GET", self._path(API_VERSION, KIND, namespace, name)))
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.apply_subresource(
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace}},
            "status",
            {"status": status},
        )

    def apply_subresource(self, obj: dict[str, Any], subresource: str, fields: dict[str, Any]) -> None:
        """Server-side apply `fields` to a subresource of `obj` (its apiVersion, kind and name)."""
        meta = obj["metadata"]
        path = self._path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        self.request(
            "PATCH",
            f"{path}/{subresource}",
            query=[("fieldManager", self._field_manager), ("force", "true")],
            body={"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta, **fields},
            content_type="application/apply-patch+yaml",
        )

    def remove_condition(self, namespace: str, name: str, condition_type: str) -> None:
        owner = self.get_owner(namespace, name)
        conditions = ((owner or {}).get("status") or {}).get("conditions") or []
        index = next((i for i, c in enumerate(conditions) if c.get("type") == condition_type), None)
        if index is None:
            return
        at = f"/status/conditions/{index}"
        self.request(
            "PATCH",
            self._path(API_VERSION, KIND, namespace, name) + "/status",
            body=[
                {"op": "test", "path": f"{at}/type", "value": condition_type},
                {"op": "remove", "path": at},
            ],
            content_type="application/json-patch+json",
        )

    def post_event(self, event: dict[str, Any]) -> None:
        self.create(event)

    def recheck(self, api_version: str) -> None:
        self._discovery.recheck(api_version)


def _base(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
