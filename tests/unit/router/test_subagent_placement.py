"""Placement for subagent trees: the parent's affinity holds while its children run, and a child does
not push its parent's retained KV out where another worker has the room."""

from __future__ import annotations

import random

from agentserve.config import RouterConfig
from agentserve.router.placement import Placement, RouteRequest
from agentserve.router.wire import decode_route, encode_route

WORKERS = ["w0", "w1"]


def placement(clock: list[float], **config: object) -> Placement:
    return Placement(RouterConfig(block_size=4, **config), rng=random.Random(1), clock=lambda: clock[0])


def child(blocks: int = 8, parent: str | None = "lead", session: str = "child") -> RouteRequest:
    # Hashes 1000+: nothing of the parent's prompt (a non-fork subagent has its own system prompt).
    return RouteRequest(
        list(range(1000, 1000 + blocks)), blocks * 4, session, osl=4, parent_session_id=parent
    )


def lead() -> RouteRequest:
    return RouteRequest(list(range(16)), 64, "lead", osl=4)


def moved_parents(children: bool) -> int:
    """Of 20 routers (seeds), how many send the parent elsewhere when it resumes at t = 29 s, after
    a turn at t = 0 and an affinity TTL of 10 s; nothing is cached anywhere, so ties decide."""
    moved = 0
    for seed in range(20):
        clock = [0.0]
        p = Placement(
            RouterConfig(block_size=4, affinity_ttl_s=10, load_weight=0.0),
            rng=random.Random(seed),
            clock=lambda now=clock: now[0],
        )
        home = p.choose(lead(), WORKERS, {}).worker
        for t in range(1, 29):  # a child's turn every second, each inside the TTL of the one before
            clock[0] = float(t)
            if children:
                p.choose(child(session=f"c{t}"), WORKERS, {})
        clock[0] = 29.0
        moved += p.choose(lead(), WORKERS, {}).worker != home
    return moved


def test_the_parents_affinity_holds_while_children_keep_coming() -> None:
    assert moved_parents(children=True) == 0
    assert moved_parents(children=False) > 0  # without them it lapses and ties are drawn again


def test_a_child_goes_where_there_is_room_rather_than_evict_its_parent() -> None:
    clock = [0.0]
    p = placement(clock, load_weight=0.0)
    p.choose(lead(), ["w0"], {})  # the parent lives on w0
    p.observe("w0", 0, 0, (0, 0), room=2)  # w0: almost everything free is retained
    p.observe("w1", 0, 0, (0, 0), room=100)
    d = p.choose(child(), WORKERS, {})
    assert d.worker == "w1"
    # w0's cost counts the child's 9 blocks (8 prompt + 1 output) beyond its 2 free ones as misses.
    assert d.costs["w0"] == 8 + 7 and d.costs["w1"] == 8


def test_siblings_still_follow_their_shared_prefix_when_it_pays() -> None:
    clock = [0.0]
    p = placement(clock, load_weight=0.0)
    p.choose(lead(), ["w0"], {})
    p.observe("w0", 0, 0, (0, 0), room=2)
    p.observe("w1", 0, 0, (0, 0), room=100)
    # The type's prefix (7 of 8 blocks) is cached on w0: 1 miss + 0 pushed out (2 blocks needed,
    # 2 free) beats 8 misses on w1.
    d = p.choose(child(), WORKERS, {"w0": 7})
    assert d.worker == "w0" and d.costs["w0"] == 1


def test_no_penalty_without_room_elsewhere_or_without_a_report() -> None:
    clock = [0.0]
    p = placement(clock, load_weight=0.0)
    p.choose(lead(), ["w0"], {})
    d = p.choose(child(), WORKERS, {})  # no load report yet: room unknown, nothing priced
    assert d.costs == {"w0": 8, "w1": 8}
    p.observe("w0", 0, 0, (0, 0), room=2)
    p.observe("w1", 0, 0, (0, 0), room=3)  # no better off: the child has to evict somewhere
    assert p.choose(child(), WORKERS, {}).costs == {"w0": 8, "w1": 8}
    # A request with no parent is priced as always.
    p.observe("w1", 0, 0, (0, 0), room=100)
    assert p.choose(child(parent=None), WORKERS, {}).costs == {"w0": 8, "w1": 8}


def test_the_parent_rides_the_route_wire() -> None:
    for encoding in ("json", "msgpack"):
        call = decode_route(encode_route(child(), frozenset(), encoding), encoding)  # type: ignore[arg-type]
        assert call.request.parent_session_id == "lead"
        assert (
            decode_route(encode_route(lead(), frozenset(), encoding), encoding).request.parent_session_id
            is None
        )  # type: ignore[arg-type]
