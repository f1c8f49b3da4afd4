"""schemathesis against `agentserve up`'s own `/openapi.json`: every operation, generated valid
(positive) and invalid (negative) requests, all of its checks — no 5xx, documented status codes,
content types, response bodies and headers conforming to the schema, invalid data rejected — but one:
`positive_data_acceptance` (a schema-valid request must be accepted) cannot hold for these APIs,
upstream or here: JSON Schema cannot say that a `tool_result` answers an earlier `tool_use`, or that
`budget_tokens` < `max_tokens`, which the decoders check (400). Bounded: a few dozen examples per
operation and mode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis (dev extra) is not installed")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402
from stack import Served, served  # noqa: E402

EXAMPLES = 25


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    with served({"max_body_bytes": 256 * 1024, "context_length": 4096}) as s:
        yield s


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_published_contract_holds(server: Served, mode: GenerationMode) -> None:
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        try:
            check()
        except Unsatisfiable:
            # Nothing of this operation can be made invalid (GET /health: no body, no parameters).
            assert mode == GenerationMode.NEGATIVE and "requestBody" not in operation.definition.raw


# Alone: beside other tests (3 xdist workers on 2 cores) the same derandomized walk twice never reached
# a link-followed GET or DELETE; alone it always does.
@pytest.mark.serial
def test_stateful_links_through_stored_responses() -> None:
    """The Responses links (`createResponse` → `getResponse` / `deleteResponse`, and the next turn
    with `previous_response_id`) followed by schemathesis' state machine, all checks as above. A
    server of its own: the same walk (derandomized) meets the same state every run."""
    with served({"context_length": 4096}) as server:
        _walk_the_links(server)


def _walk_the_links(server: Served) -> None:
    api = schemathesis.openapi.from_url(server.url + "/openapi.json").include(path_regex="^/v1/responses")
    # Valid requests only: the walk is about following links from stored responses, and negative
    # bodies (b"\x00", refused with a 400) took every step of the derandomized walk here.
    api.config.generation.update(modes=[GenerationMode.POSITIVE])
    seen: list[tuple[str, int]] = []

    class Checked(api.as_state_machine()):  # type: ignore[misc]
        def validate_response(self, response: Any, case: schemathesis.Case, **kwargs: Any) -> None:
            continued = isinstance(case.body, dict) and case.body.get("previous_response_id") is not None
            seen.append(
                (f"{case.method} {case.path}{' (continued)' if continued else ''}", response.status_code)
            )
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

    Checked.run(
        settings=settings(
            max_examples=40,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same walk every run
        )
    )
    # The links were followed: a stored response was fetched or deleted by the id its creation returned.
    followed = {("GET /v1/responses/{response_id}", 200), ("DELETE /v1/responses/{response_id}", 200)}
    assert followed & set(seen), sorted(set(seen))
    # and the next turn was sent from one (200, or 400 where the first was `store: false` or the
    # generated rest of the body is refused: the checks above hold either way)
    assert any(name == "POST /v1/responses (continued)" for name, _ in seen), sorted(set(seen))
