"""KV retention end to end: `agentserve up` decides it, the sim worker's pool honours it
(the official `anthropic` SDK as the client)."""

from __future__ import annotations

from typing import Any

import anthropic
from sim_scenarios import ANTHROPIC_TOOLS
from stack import Served, served

from agentserve.worker.engines.sim import SimEngine


def pool_classes(s: Served) -> dict[int, int]:
    """Unreferenced cached blocks per retention class, over every sim worker."""
    out: dict[int, int] = {}
    for engine in s.backend.engines.values():
        assert isinstance(engine, SimEngine)
        pool = engine.pool
        for h in pool.snapshot().block_hashes:
            prio = pool.priority_of(h)
            if prio is not None:
                out[prio] = out.get(prio, 0) + 1
    return out


def ask(s: Served, **extra: Any) -> None:
    c = anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0)
    text = "Please look at the repository and tell me what it does. " * 30
    c.messages.create(
        model="m", max_tokens=16, messages=[{"role": "user", "content": text}], tools=ANTHROPIC_TOOLS, **extra
    )


def test_an_agent_request_leaves_its_blocks_in_the_session_class() -> None:
    with served({"workers": 1}) as s:
        ask(s)
        classes = pool_classes(s)
        assert classes.get(80, 0) > 0, classes
        assert set(classes) <= {80, 90}


def test_kv_retention_off_leaves_plain_lru() -> None:
    with served({"workers": 1, "kv_retention": "off"}) as s:
        ask(s)
        classes = pool_classes(s)
        assert set(classes) == {35}, classes
