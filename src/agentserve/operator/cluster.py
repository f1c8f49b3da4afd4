"""The Kubernetes API at the operator's edge: the few calls the reconcile loop makes.

`Cluster` is the boundary the reconcile loop is written against; `KubeCluster` implements it with the
official client's `DynamicClient` (server-side apply with our field manager, create-if-absent, list by
label, delete, status patches). Every API failure surfaces as `ClusterError`, so callers handle one
exception type.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from agentserve.operator.build import MANAGED_BY
from agentserve.operator.reconcile import ObjectRef
from agentserve.operator.spec import API_VERSION, KIND


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

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...


class KubeCluster:
    """`Cluster` over the official kubernetes client (in-cluster config, else kubeconfig)."""

    def __init__(
        self, api_client: Any = None, field_manager: str = MANAGED_BY, discovery_cache: str | None = None
    ) -> None:
        # The client's typing varies by release: hold its modules as Any.
        config: Any = importlib.import_module("kubernetes.config")
        client: Any = importlib.import_module("kubernetes.client")
        dynamic: Any = importlib.import_module("kubernetes.dynamic")
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._dyn: Any = dynamic.DynamicClient(api_client, cache_file=discovery_cache)
        self._field_manager = field_manager

    def _resource(self, api_version: str, kind: str) -> Any:
        exceptions: Any = importlib.import_module("kubernetes.dynamic.exceptions")
        try:
            return self._dyn.resources.get(api_version=api_version, kind=kind)
        except exceptions.ResourceNotFoundError as exc:
            raise KindNotInstalled(f"{kind} ({api_version}) is not served by this cluster", 404) from exc

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        api_exception: Any = importlib.import_module("kubernetes.client.exceptions").ApiException
        try:
            return fn(*args, **kwargs)
        except api_exception as exc:
            raise ClusterError(f"{exc.status} {exc.reason}: {exc.body}", exc.status) from exc
        except OSError as exc:
            raise ClusterError(str(exc)) from exc

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self._resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        out = self._call(
            self._dyn.server_side_apply,
            res,
            body=obj,
            name=meta["name"],
            namespace=meta["namespace"],
            field_manager=self._field_manager,
            force_conflicts=True,
        )
        return dict(out.to_dict())

    def create(self, obj: dict[str, Any]) -> bool:
        res = self._resource(obj["apiVersion"], obj["kind"])
        try:
            self._call(
                self._dyn.create,
                res,
                body=obj,
                namespace=obj["metadata"]["namespace"],
                field_manager=self._field_manager,
            )
        except ClusterError as exc:
            if exc.status == 409:  # AlreadyExists: the apiserver keeps the existing object untouched
                return False
            raise
        return True

    def delete(self, ref: ObjectRef) -> None:
        res = self._resource(ref.api_version, ref.kind)
        try:
            self._call(
                self._dyn.delete,
                res,
                name=ref.name,
                namespace=ref.namespace,
                body={"propagationPolicy": "Background"},
            )
        except ClusterError as exc:
            if exc.status != 404:
                raise

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        res = self._resource(api_version, kind)
        out = self._call(self._dyn.get, res, namespace=namespace, label_selector=label_selector)
        items: list[dict[str, Any]] = out.to_dict().get("items") or []
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def get_owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        res = self._resource(API_VERSION, KIND)
        try:
            return dict(self._call(self._dyn.get, res, name=name, namespace=namespace).to_dict())
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        res = self._resource(API_VERSION, KIND)
        self._call(
            self._dyn.patch,
            res.subresources["status"],
            body={"status": status},
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )
