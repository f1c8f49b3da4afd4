from __future__ import annotations

import random

import pytest

from agentserve.config import RouterConfig
from agentserve.router.placement import NoWorkerError, Placement, RouteRequest

WORKERS = ["w0", "w1", "w2"]


def placement(clock: list[float] | None = None, **config: object) -> Placement:
    now = clock if clock is not None else [0.0]
    return Placement(RouterConfig(block_size=4, **config), rng=random.Random(1), clock=lambda: now[0])


def req(blocks: int = 4, session: str | None = None, osl: int | None = 4) -> RouteRequest:
    return RouteRequest(list(range(blocks)), prompt_tokens=blocks * 4, session_id=session, osl=osl)


def test_kv_policy_follows_the_cache() -> None:
    p = placement()
    d = p.choose(req(), WORKERS, {"w0": 0, "w1": 3, "w2": 1})
    assert d.worker == "w1" and d.overlap_blocks == 3 and d.prompt_blocks == 4


def test_kv_policy_weighs_load_against_cache() -> None:
    # Dynamo's documented example shape: cost = prefill blocks + decode blocks (both weights 1).
    p = placement(load_weight=1.0)
    for _ in range(3):  # load w1 with three requests of 4 prompt + 1 output block each
        p.choose(req(), ["w1"], {})
    d = p.choose(req(), ["w0", "w1"], {"w0": 0, "w1": 4})
    assert d.costs == {"w0": 4.0, "w1": 15.0}
    assert d.worker == "w0"


def test_finish_releases_load() -> None:
    p = placement()
    d = p.choose(req(), ["w0"], {})
    assert p.load("w0") == 5 and p.inflight("w0") == 1
    p.finish(d.ticket)
    p.finish(d.ticket)  # idempotent
    assert p.load("w0") == 0 and p.inflight("w0") == 0


def test_osl_hint_counts_in_expected_load() -> None:
    p = placement()
    p.choose(req(osl=400), ["w0"], {})  # 4 prompt + 100 output blocks
    p.choose(req(osl=4), ["w1"], {})
    assert p.load("w0") == 104 and p.load("w1") == 5


def test_session_affinity_breaks_ties_until_its_ttl_expires() -> None:
    clock = [0.0]
    p = placement(clock, affinity_ttl_s=10, load_weight=0.0)
    first = p.choose(req(session="s"), WORKERS, {}).worker
    assert all(p.choose(req(session="s"), WORKERS, {}).worker == first for _ in range(20))
    clock[0] = 11.0
    chosen = {p.choose(req(session=f"other{i}"), WORKERS, {}).worker for i in range(30)}
    assert len(chosen) > 1  # without affinity, ties spread


def test_affinity_never_beats_a_cheaper_worker() -> None:
    p = placement(affinity_ttl_s=100)
    p.choose(req(session="s"), ["w0"], {})
    assert p.choose(req(session="s"), ["w0", "w1"], {"w1": 4}).worker == "w1"


def test_temperature_samples_but_prefers_cheap_workers() -> None:
    p = placement(temperature=0.2, load_weight=0.0)
    picks = [p.choose(req(), WORKERS, {"w0": 4, "w1": 0, "w2": 0}).worker for _ in range(300)]
    assert picks.count("w0") > 200 and len(set(picks)) > 1


@pytest.mark.parametrize("policy", ["round-robin", "random", "least-loaded"])
def test_comparison_policies_ignore_the_cache(policy: str) -> None:
    p = placement(policy=policy)
    picks = {p.choose(req(), WORKERS, {"w0": 4}).worker for _ in range(30)}
    assert picks == set(WORKERS)


def test_excluded_workers_are_skipped_and_none_left_is_an_error() -> None:
    p = placement()
    assert p.choose(req(), WORKERS, {"w1": 4}, exclude=frozenset({"w1"})).worker != "w1"
    with pytest.raises(NoWorkerError):
        p.choose(req(), ["w0"], {}, exclude=frozenset({"w0"}))


def test_forgetting_a_worker_drops_its_load_and_sessions() -> None:
    p = placement(affinity_ttl_s=100)
    p.choose(req(session="s"), ["w0"], {})
    p.forget_worker("w0")
    assert p.load("w0") == 0 and p.inflight("w0") == 0


def test_tickets_never_finished_expire_and_stop_counting() -> None:
    clock = [0.0]
    p = placement(clock)
    old = p.choose(RouteRequest([], 8), ["a"], {})
    clock[0] = 50.0
    new = p.choose(RouteRequest([], 8), ["a"], {})
    assert p.inflight("a") == 2
    clock[0] = 120.0
    assert p.expire(100.0) == 1  # only the one routed at t=0 is older than 100 s
    assert p.inflight("a") == 1 and p.load("a") == new.prompt_blocks + 64
    p.finish(old.ticket)  # a late finish of an expired ticket changes nothing
    assert p.inflight("a") == 1


# -- the in-flight view rebuilt from what workers report (issue 12: a router replica restart) --------


def test_a_restarted_router_takes_the_load_workers_report_it_never_routed() -> None:
    p = placement(load_weight=1.0)
    p.observe("w0", requests=3, blocks=30, tracked=p.tracked("w0"))  # nothing tracked after a restart
    assert p.inflight("w0") == 3 and p.load("w0") == 30 and p.inflight("w1") == 0
    d = p.choose(req(), ["w0", "w1"], {})  # equal cache: the load the worker reported decides
    assert d.worker == "w1" and d.costs["w0"] == 4.0 + 30
    # Its own tickets add to what the worker held beyond them; the next report replaces the rest.
    p.choose(req(), ["w0"], {})
    assert p.inflight("w0") == 4
    p.observe("w0", requests=1, blocks=5, tracked=p.tracked("w0"))  # the old three finished
    assert p.inflight("w0") == 1 and p.load("w0") == 5
    p.forget_worker("w0")
    assert p.inflight("w0") == 0


def test_a_report_counts_nothing_twice_when_requests_finish_meanwhile() -> None:
    p = placement()
    d = p.choose(req(), ["w0"], {})
    asked = p.tracked("w0")  # the question leaves while the request runs
    p.finish(d.ticket)  # it finishes before the answer arrives
    p.observe("w0", requests=1, blocks=5, tracked=asked)  # the answer still counts it
    assert p.inflight("w0") == 0 and p.load("w0") == 0
    # Another replica's requests on the same worker: what exceeds this router's tickets.
    mine = p.choose(req(), ["w0"], {})
    p.observe("w0", requests=3, blocks=15, tracked=p.tracked("w0"))
    assert p.inflight("w0") == 3
    p.finish(mine.ticket)
    assert p.inflight("w0") == 2
