"""Discovery's pure parts: static URLs, the KV endpoint a worker advertises, EndpointSlices → workers."""

from __future__ import annotations

from typing import Any

import pytest

from agentserve.router.discovery import (
    SliceSet,
    WorkerEndpoint,
    diff,
    endpoints_of_slice,
    kv_endpoint_for,
    static_endpoints,
)


def eps(
    name: str,
    *endpoints: dict[str, Any],
    ports: tuple[tuple[str, int], ...] = (("http", 8200), ("kv-events", 5557)),
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "w"}},
        "addressType": "IPv4",
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
        "endpoints": list(endpoints),
    }


def ep(
    ip: str, pod: str | None = None, ready: bool | None = True, terminating: bool | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"addresses": [ip], "conditions": {}}
    if ready is not None:
        out["conditions"]["ready"] = ready
    if terminating is not None:
        out["conditions"]["terminating"] = terminating
    if pod:
        out["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "ns"}
    return out


def test_static_workers_are_named_by_their_url() -> None:
    got = static_endpoints(["http://127.0.0.1:8200/", " http://10.0.0.2:9000"])
    assert got == {
        "http://127.0.0.1:8200": WorkerEndpoint("http://127.0.0.1:8200", "http://127.0.0.1:8200"),
        "http://10.0.0.2:9000": WorkerEndpoint("http://10.0.0.2:9000", "http://10.0.0.2:9000"),
    }
    for bad in ("127.0.0.1:8200", "https://h:1", "http://h"):
        with pytest.raises(ValueError, match="http://host:port"):
            static_endpoints([bad])


def test_a_wildcard_kv_address_is_reached_at_the_workers_host() -> None:
    assert kv_endpoint_for("http://10.1.2.3:8200", "tcp://0.0.0.0:5557") == "tcp://10.1.2.3:5557"
    assert kv_endpoint_for("http://10.1.2.3:8200", "tcp://*:5557") == "tcp://10.1.2.3:5557"
    assert kv_endpoint_for("http://[fd00::1]:8200", "tcp://[::]:5557") == "tcp://[fd00::1]:5557"
    assert kv_endpoint_for("http://10.1.2.3:8200", "tcp://127.0.0.1:6000") == "tcp://127.0.0.1:6000"
    with pytest.raises(ValueError):
        kv_endpoint_for("http://h:1", "ipc:///tmp/kv")


def test_only_ready_endpoints_become_workers_named_by_pod() -> None:
    got = endpoints_of_slice(
        eps(
            "w-abc",
            ep("10.0.0.1", "w-0"),
            ep("10.0.0.2", "w-1", ready=False),
            ep("10.0.0.3", "w-2", ready=None),  # unknown readiness reads as ready
            ep("10.0.0.4", "w-3", ready=True, terminating=True),
            ep("10.0.0.5"),  # no targetRef: named by address
        )
    )
    assert got == {
        "w-0": WorkerEndpoint("w-0", "http://10.0.0.1:8200", "tcp://10.0.0.1:5557"),
        "w-2": WorkerEndpoint("w-2", "http://10.0.0.3:8200", "tcp://10.0.0.3:5557"),
        "10.0.0.5": WorkerEndpoint("10.0.0.5", "http://10.0.0.5:8200", "tcp://10.0.0.5:5557"),
    }


def test_ports_are_found_by_name_and_ipv6_is_bracketed() -> None:
    s = eps("x", ep("fd00::7", "w-0"), ports=(("kv-events", 7000), ("http", 9000)))
    s["addressType"] = "IPv6"
    assert endpoints_of_slice(s)["w-0"] == WorkerEndpoint(
        "w-0", "http://[fd00::7]:9000", "tcp://[fd00::7]:7000"
    )
    no_kv = eps("x", ep("10.0.0.1", "w-0"), ports=(("http", 8200),))
    assert endpoints_of_slice(no_kv)["w-0"].kv_endpoint is None  # falls back to /info
    assert endpoints_of_slice(eps("x", ep("10.0.0.1", "w-0"), ports=())) == {}


def test_slice_events_add_move_and_remove_workers() -> None:
    slices = SliceSet()
    slices.replace([eps("a", ep("10.0.0.1", "w-0")), eps("b", ep("10.0.0.2", "w-1"))])
    assert set(slices.endpoints()) == {"w-0", "w-1"}
    slices.apply("MODIFIED", eps("a", ep("10.0.0.1", "w-0"), ep("10.0.0.3", "w-2")))
    assert set(slices.endpoints()) == {"w-0", "w-1", "w-2"}
    slices.apply("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    slices.apply("DELETED", eps("b"))
    assert set(slices.endpoints()) == {"w-0", "w-2"}
    slices.replace([eps("c", ep("10.0.0.9", "w-0"))])  # a relist forgets slices it lacks
    assert slices.endpoints() == {"w-0": WorkerEndpoint("w-0", "http://10.0.0.9:8200", "tcp://10.0.0.9:5557")}


def test_diff_names_added_removed_and_moved_workers() -> None:
    a = WorkerEndpoint("a", "http://1.1.1.1:1")
    b = WorkerEndpoint("b", "http://1.1.1.2:1")
    b2 = WorkerEndpoint("b", "http://1.1.1.3:1")
    c = WorkerEndpoint("c", "http://1.1.1.4:1")
    d = diff({"a": a, "b": b}, {"b": b2, "c": c})
    assert d.added == (c,) and d.removed == ("a",) and d.changed == (b2,)
    assert diff({"a": a}, {"a": a}).empty
