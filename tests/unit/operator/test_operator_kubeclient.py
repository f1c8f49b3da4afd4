"""`KubeCluster` (the real kubernetes client) over HTTP, against a loopback fake of the API.

No kube-apiserver can run here, so this fake serves only what the operator's calls touch: discovery
(`/version`, `/apis`, `/api/v1`, `/apis/GROUP/VERSION`), list by label selector, get, server-side apply
(PATCH `application/apply-patch+yaml`), create (POST; 409 AlreadyExists for a taken name), delete and
merge patches of `/status`. It checks the requests the
client sends (content types, field manager, force) — the contract a real apiserver enforces — and keeps
objects in memory. Semantics beyond that (admission, defaulting, garbage collection) are not modelled.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from agentserve.operator.build import MANAGED_BY
from agentserve.operator.cluster import ClusterError, KindNotInstalled, KubeCluster
from agentserve.operator.handlers import sync
from agentserve.operator.reconcile import ObjectRef

RESOURCES: dict[str, list[tuple[str, str]]] = {  # group/version → (plural, kind)
    "v1": [
        ("configmaps", "ConfigMap"),
        ("services", "Service"),
        ("serviceaccounts", "ServiceAccount"),
        ("pods", "Pod"),
        ("secrets", "Secret"),
    ],
    "apps/v1": [("deployments", "Deployment"), ("statefulsets", "StatefulSet")],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget")],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy")],
    "rbac.authorization.k8s.io/v1": [("roles", "Role"), ("rolebindings", "RoleBinding")],
    "agentserve.dev/v1alpha1": [("agentservingdeployments", "AgentServingDeployment")],
}


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (gv, plural, ns, name)
        self.requests: list[tuple[str, str, str, dict[str, list[str]]]] = []  # method, path, ctype, query
        self.fail_patch_status = 0
        self.forbid_create = False  # RBAC without the create verb

    def kind(self, gv: str, plural: str) -> str:
        return dict(RESOURCES[gv])[plural]

    def discovery(self, gv: str) -> dict[str, Any]:
        resources = []
        for plural, kind in RESOURCES[gv]:
            resources.append(
                {
                    "name": plural,
                    "singularName": "",
                    "namespaced": True,
                    "kind": kind,
                    "verbs": ["get", "list", "patch", "create"],
                }
            )
            if kind == "AgentServingDeployment":
                resources.append(
                    {"name": f"{plural}/status", "namespaced": True, "kind": kind, "verbs": ["patch"]}
                )
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}


def _selected(obj: dict[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (p.split("=", 1) for p in selector.split(",") if p))


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _merge(old.get(k), v) for k, v in new.items()}}
    return new


def make_handler(api: FakeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str, str, str, str | None, str | None] | None:
            parts = [p for p in urlparse(self.path).path.split("/") if p]
            if parts[:1] == ["api"]:
                gv, rest = parts[1], parts[2:]
            elif parts[:1] == ["apis"] and len(parts) >= 3:
                gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
            else:
                return None
            if len(rest) < 3 or rest[0] != "namespaces":
                return None
            name = rest[3] if len(rest) > 3 else None
            sub = rest[4] if len(rest) > 4 else None
            return gv, rest[2], rest[1], name, sub

        def _record(self) -> dict[str, list[str]]:
            query = parse_qs(urlparse(self.path).query)
            api.requests.append(
                (self.command, urlparse(self.path).path, self.headers.get("Content-Type", ""), query)
            )
            return query

        def do_GET(self) -> None:
            query = self._record()
            path = urlparse(self.path).path
            if path == "/version":
                return self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0"})
            if path == "/apis":
                groups = []
                for gv in RESOURCES:
                    if "/" in gv:
                        group, version = gv.split("/")
                        entry = {"groupVersion": gv, "version": version}
                        groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
                return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            if path == "/api":
                return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
            if path in ("/api/v1",) or (path.startswith("/apis/") and path.count("/") == 3):
                gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
                if gv not in RESOURCES:
                    return self._send(404, _status(404, "NotFound"))
                return self._send(200, api.discovery(gv))
            route = self._route()
            if route is None:
                return self._send(404, _status(404, "NotFound"))
            gv, plural, ns, name, _ = route
            if name is None:
                selector = query.get("labelSelector", [""])[0]
                items = [
                    {k: v for k, v in o.items() if k not in ("apiVersion", "kind")}
                    for (g, p, n, _), o in sorted(api.objects.items())
                    if (g, p, n) == (gv, plural, ns) and _selected(o, selector)
                ]
                kind = api.kind(gv, plural)
                return self._send(
                    200, {"kind": f"{kind}List", "apiVersion": gv, "metadata": {}, "items": items}
                )
            obj = api.objects.get((gv, plural, ns, name))
            return self._send(200, obj) if obj else self._send(404, _status(404, "NotFound"))

        def _patch_status(
            self, key: tuple[str, str, str, str], body: Any, ctype: str, query: dict[str, Any]
        ) -> None:
            """Status by server-side apply (conditions a list-map keyed by type: other types stay)
            or a JSON patch removing one condition after testing its type."""
            if key not in api.objects:
                return self._send(404, _status(404, "NotFound"))
            stored = api.objects[key].get("status") or {}
            if ctype == "application/json-patch+json":
                test, remove = body
                index = int(remove["path"].rsplit("/", 1)[1])
                assert test["path"] == f"/status/conditions/{index}/type"
                if stored["conditions"][index]["type"] != test["value"]:
                    return self._send(422, _status(422, "Invalid"))
                del stored["conditions"][index]
                return self._send(200, api.objects[key])
            if ctype != "application/apply-patch+yaml" or "fieldManager" not in query:
                return self._send(415, _status(415, "UnsupportedMediaType"))
            applied = body["status"].get("conditions")
            merged = _merge(stored, body["status"])
            if applied is not None:
                types = {c["type"] for c in applied}
                merged["conditions"] = [
                    *(c for c in stored.get("conditions") or [] if c["type"] not in types),
                    *applied,
                ]
            api.objects[key]["status"] = merged
            return self._send(200, api.objects[key])

        def do_PATCH(self) -> None:
            query = self._record()
            route = self._route()
            assert route is not None
            gv, plural, ns, name, sub = route
            assert name is not None
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ctype = self.headers.get("Content-Type", "")
            key = (gv, plural, ns, name)
            if sub == "status":
                if api.fail_patch_status:
                    api.fail_patch_status -= 1
                    return self._send(500, _status(500, "InternalError"))
                return self._patch_status(key, body, ctype, query)
            if ctype != "application/apply-patch+yaml" or "fieldManager" not in query:
                return self._send(415, _status(415, "UnsupportedMediaType"))
            if body.get("kind") != api.kind(gv, plural) or body["metadata"]["name"] != name:
                return self._send(400, _status(400, "BadRequest"))
            api.objects[key] = _merge(api.objects.get(key, {}), body)
            return self._send(200, api.objects[key])

        def do_POST(self) -> None:
            query = self._record()
            route = self._route()
            assert route is not None
            gv, plural, ns, name, _ = route
            assert name is None  # a create names the collection
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if api.forbid_create:
                return self._send(403, _status(403, "Forbidden"))
            if not self.headers.get("Content-Type", "").startswith("application/json"):
                return self._send(415, _status(415, "UnsupportedMediaType"))
            if body.get("kind") != api.kind(gv, plural) or "fieldManager" not in query:
                return self._send(400, _status(400, "BadRequest"))
            key = (gv, plural, ns, body["metadata"]["name"])
            if key in api.objects:
                return self._send(409, _status(409, "AlreadyExists"))
            api.objects[key] = body
            return self._send(201, body)

        def do_DELETE(self) -> None:
            self._record()
            route = self._route()
            assert route is not None
            gv, plural, ns, name, _ = route
            if api.objects.pop((gv, plural, ns, str(name)), None) is None:
                return self._send(404, _status(404, "NotFound"))
            return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    return Handler


@pytest.fixture
def api_and_cluster(tmp_path: Path) -> Iterator[tuple[FakeAPI, KubeCluster]]:
    from kubernetes import client

    api = FakeAPI()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(api))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    cluster = KubeCluster(client.ApiClient(config))
    try:
        yield api, cluster
    finally:
        server.shutdown()
        server.server_close()


def cr() -> dict[str, Any]:
    return {
        "apiVersion": "agentserve.dev/v1alpha1",
        "kind": "AgentServingDeployment",
        "metadata": {"name": "coder", "namespace": "ai", "uid": "u-1", "generation": 1},
        "spec": {"model": {"name": "m"}, "workers": {"engine": "sim"}},
    }


def test_sync_applies_every_child_with_server_side_apply(
    api_and_cluster: tuple[FakeAPI, KubeCluster],
) -> None:
    api, cluster = api_and_cluster
    result = sync(cluster, cr())
    assert result.failure is None, result.failure
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert len(patches) == len(result.plan.apply) == 14
    for _, _, ctype, query in patches:
        assert ctype == "application/apply-patch+yaml"
        assert query["fieldManager"] == [MANAGED_BY] and query["force"] == ["true"]
    kinds = sorted(k for (_, _, _, _), o in api.objects.items() for k in [o["kind"]])
    assert kinds.count("Deployment") == 3
    # the signing key: one create, before any apply
    (post,) = [r for r in api.requests if r[0] == "POST"]
    assert post[1] == "/api/v1/namespaces/ai/secrets" and post[3]["fieldManager"] == [MANAGED_BY]
    assert api.requests.index(post) < api.requests.index(patches[0])
    assert [o["kind"] for o in api.objects.values()].count("Secret") == 1
    # steady state: reads, and the signing key's create refused because it exists
    api.requests.clear()
    again = sync(cluster, cr())
    assert again.plan.empty and again.created == [] and again.failure is None
    assert [(r[0], r[1]) for r in api.requests if r[0] != "GET"] == [
        ("POST", "/api/v1/namespaces/ai/secrets")
    ]


def test_create_makes_an_object_once_and_never_touches_an_existing_one(
    api_and_cluster: tuple[FakeAPI, KubeCluster],
) -> None:
    api, cluster = api_and_cluster
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "coder-signing-key", "namespace": "ai"},
        "data": {"signing-key": "MDAxMQ=="},
    }
    assert cluster.create(secret) is True
    other = {**secret, "data": {"signing-key": "OTk5OQ=="}}
    assert cluster.create(other) is False
    assert api.objects[("v1", "secrets", "ai", "coder-signing-key")]["data"] == {"signing-key": "MDAxMQ=="}
    api.forbid_create = True
    with pytest.raises(ClusterError) as raised:  # other failures still surface
        cluster.create({**secret, "metadata": {"name": "another", "namespace": "ai"}})
    assert raised.value.status == 403
    assert ("v1", "secrets", "ai", "another") not in api.objects


def test_listed_items_get_their_kind_back_and_missing_kinds_are_reported(
    api_and_cluster: tuple[FakeAPI, KubeCluster],
) -> None:
    _, cluster = api_and_cluster
    sync(cluster, cr())
    items = cluster.list("v1", "ConfigMap", "ai", "app.kubernetes.io/instance=coder")
    assert [(i["apiVersion"], i["kind"], i["metadata"]["name"]) for i in items] == [
        ("v1", "ConfigMap", "coder-config")
    ]
    assert cluster.list("v1", "ConfigMap", "ai", "app.kubernetes.io/instance=other") == []
    with pytest.raises(KindNotInstalled):
        cluster.list("monitoring.coreos.com/v1", "ServiceMonitor", "ai", "a=b")
    body = cr()
    body["spec"]["observability"] = {"serviceMonitor": {"enabled": True}}
    result = sync(cluster, body)
    assert result.failure is not None and "ServiceMonitor" in result.failure.message


def test_delete_owner_and_status(api_and_cluster: tuple[FakeAPI, KubeCluster]) -> None:
    api, cluster = api_and_cluster
    assert cluster.get_owner("ai", "coder") is None
    api.objects[("agentserve.dev/v1alpha1", "agentservingdeployments", "ai", "coder")] = cr()
    owner = cluster.get_owner("ai", "coder")
    assert owner is not None and owner["metadata"]["uid"] == "u-1"
    cluster.patch_status("ai", "coder", {"observedGeneration": 1, "conditions": []})
    stored = api.objects[("agentserve.dev/v1alpha1", "agentservingdeployments", "ai", "coder")]
    assert stored["status"] == {"observedGeneration": 1, "conditions": []}
    planner = {"type": "Autoscaling", "status": "True"}
    stored["status"]["conditions"] = [planner]
    cluster.patch_status("ai", "coder", {"observedGeneration": 1, "conditions": [{"type": "Ready"}]})
    assert stored["status"]["conditions"] == [planner, {"type": "Ready"}]
    cluster.remove_condition("ai", "coder", "Autoscaling")
    cluster.remove_condition("ai", "coder", "Autoscaling")  # gone already: nothing sent
    assert stored["status"]["conditions"] == [{"type": "Ready"}]
    api.fail_patch_status = 1
    with pytest.raises(ClusterError) as raised:
        cluster.patch_status("ai", "coder", {"observedGeneration": 2})
    assert raised.value.status == 500
    sync(cluster, cr())
    cluster.delete(ObjectRef("v1", "ConfigMap", "ai", "coder-config"))
    assert ("v1", "configmaps", "ai", "coder-config") not in api.objects
    cluster.delete(ObjectRef("v1", "ConfigMap", "ai", "coder-config"))  # already gone: fine


def _discovery_gets(api: FakeAPI, gv: str) -> int:
    return sum(1 for r in api.requests if r[0] == "GET" and r[1] == f"/apis/{gv}")


def test_discovery_reads_each_group_version_once_even_under_concurrent_syncs(
    api_and_cluster: tuple[FakeAPI, KubeCluster],
) -> None:
    api, cluster = api_and_cluster
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(3):
                result = sync(cluster, cr())
                assert result.failure is None, result.failure
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert _discovery_gets(api, "apps/v1") == 1
    assert sum(1 for r in api.requests if r[1] == "/api/v1") == 1
    # The optional ServiceMonitor kind (not installed) was asked once, not on each of the 24 syncs.
    assert _discovery_gets(api, "monitoring.coreos.com/v1") == 1


def test_a_missing_optional_kind_is_looked_up_again_after_the_retry_window(
    api_and_cluster: tuple[FakeAPI, KubeCluster],
) -> None:
    from kubernetes import client

    api, first = api_and_cluster
    config = client.Configuration()
    config.host = first._api.configuration.host
    cluster = KubeCluster(client.ApiClient(config), missing_kind_retry_seconds=0.2)
    with pytest.raises(KindNotInstalled):
        cluster.list("monitoring.coreos.com/v1", "ServiceMonitor", "ai", "a=b")
    with pytest.raises(KindNotInstalled):  # within the window: no new lookup
        cluster.list("monitoring.coreos.com/v1", "ServiceMonitor", "ai", "a=b")
    assert _discovery_gets(api, "monitoring.coreos.com/v1") == 1
    RESOURCES["monitoring.coreos.com/v1"] = [("servicemonitors", "ServiceMonitor")]  # CRD installed
    try:
        time.sleep(0.25)
        assert cluster.list("monitoring.coreos.com/v1", "ServiceMonitor", "ai", "a=b") == []
        assert _discovery_gets(api, "monitoring.coreos.com/v1") == 2
    finally:
        del RESOURCES["monitoring.coreos.com/v1"]


def test_an_unreachable_api_server_is_a_cluster_error() -> None:
    from kubernetes import client

    config = client.Configuration()
    config.host = "http://127.0.0.1:9"  # discard port: connection refused
    config.retries = False
    cluster = KubeCluster(client.ApiClient(config))
    with pytest.raises(ClusterError):
        cluster.list("v1", "ConfigMap", "ai", "a=b")
