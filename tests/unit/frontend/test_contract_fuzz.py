"""Fuzzing the contract in the suite (bounded): mutated harness requests and raw bytes, streaming and
not, for each API, against the in-process `agentserve up` app. Every answer is < 500, every error is
in the API's shape, every event stream ends with its API's terminal event.

The mutations are bench/fuzz_api.py's (its long seeded run: 20,000 requests, see bench/README.md);
hypothesis drives them here, so a failure shrinks to the smallest random seed and is replayed.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from agentserve.config import UpConfig
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.up import build_up

sys.path.insert(0, str(Path(__file__).parents[3] / "bench"))
from fuzz_api import HEADERS, SEEDS, mutated_request, problem

EXAMPLES = 250  # per endpoint: ~1,000 requests in a few seconds


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    config = UpConfig.model_validate(
        {"port": 0, "sim_speedup": 0, "context_length": 8192, "max_body_bytes": 1 << 20}
    )
    app, _ = build_up(config, keys=ApiKeys())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def answer_problem(client: TestClient, endpoint: str, content: bytes) -> str | None:
    r = client.post(endpoint, content=content, headers=HEADERS)
    return problem(endpoint, r.status_code, r.headers.get("content-type", ""), r.content)


@pytest.mark.parametrize("endpoint", list(SEEDS))
def test_mutated_requests_keep_the_contract(client: TestClient, endpoint: str) -> None:
    streams = 0

    @given(rng=st.randoms(use_true_random=False))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(rng: random.Random) -> None:
        nonlocal streams
        request = mutated_request(rng, endpoint)
        streams += request.stream
        bad = answer_problem(client, endpoint, request.content)
        assert bad is None, (bad, request.content[:500])

    run()
    assert endpoint.endswith("count_tokens") or streams > EXAMPLES // 5  # streaming was exercised


@pytest.mark.parametrize("endpoint", list(SEEDS))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(raw=st.binary(max_size=300) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_raw_bytes_are_the_apis_400(client: TestClient, endpoint: str, raw: bytes) -> None:
    assert answer_problem(client, endpoint, raw) is None


@pytest.mark.parametrize("endpoint", [e for e in SEEDS if not e.endswith("count_tokens")])
def test_a_valid_stream_of_each_api_is_complete(client: TestClient, endpoint: str) -> None:
    body = {**SEEDS[endpoint], "stream": True}
    r = client.post(endpoint, content=json.dumps(body), headers=HEADERS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert problem(endpoint, r.status_code, r.headers["content-type"], r.content) is None
    truncated = r.content[: len(r.content) // 2]  # the checker itself tells a cut stream
    assert problem(endpoint, 200, "text/event-stream", truncated) == "stream without a terminal event"
