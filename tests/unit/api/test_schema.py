"""`/openapi.json` is a valid OpenAPI 3.1 document and describes what the decoders accept.

The decoders decide (they run on every request; the schema's models never do), so the schema is held
to them: the captured harness requests validate, and whatever a decoder accepts among thousands of
fuzzed requests (bench/fuzz_api.py's mutations of harness-shaped bodies), the schema accepts too.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from starlette.testclient import TestClient

from agentserve.api.anthropic import decode_count_tokens, decode_messages
from agentserve.api.chat import decode_chat
from agentserve.api.errors import ApiError
from agentserve.api.memory import CallMemory
from agentserve.api.responses import ResponseStore, decode_responses
from agentserve.api.signing import Signer
from agentserve.config import UpConfig
from agentserve.frontend.http import ApiKeys, parse_json
from agentserve.frontend.up import build_up

from .test_fuzz import BODIES as HARNESS_BODIES

sys.path.insert(0, str(Path(__file__).parents[3] / "bench"))
from fuzz_api import SEEDS, mutated_request

SIGNER = Signer(b"s" * 32)
SCHEMAS = {
    "/v1/messages": "AnthropicMessagesRequest",
    "/v1/messages/count_tokens": "AnthropicCountTokensRequest",
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/responses": "ResponsesRequest",
}
DECODERS: dict[str, Callable[[Any], Any]] = {
    "/v1/messages": lambda b: decode_messages(b, memory=CallMemory(), signer=SIGNER),
    "/v1/messages/count_tokens": lambda b: decode_count_tokens(b, memory=CallMemory(), signer=SIGNER),
    "/v1/chat/completions": lambda b: decode_chat(b, memory=CallMemory()),
    "/v1/responses": lambda b: decode_responses(b, signer=SIGNER, store=ResponseStore()),
}
HARNESS_ENDPOINT = {"messages": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}


@pytest.fixture(scope="module")
def doc() -> Iterator[dict[str, Any]]:
    app, _ = build_up(UpConfig.model_validate({"port": 0, "sim_speedup": 0}), keys=ApiKeys())
    with TestClient(app) as client:
        yield client.get("/openapi.json").json()


def validator(doc: dict[str, Any], name: str) -> Draft202012Validator:
    # The document is the root, so `#/components/schemas/…` references resolve inside it.
    return Draft202012Validator({**doc, "$ref": f"#/components/schemas/{name}"})


def test_the_document_is_valid_openapi(doc: dict[str, Any]) -> None:
    validate(doc)
    assert doc["openapi"].startswith("3.1")


def test_every_api_body_has_a_real_schema_and_status_codes(doc: dict[str, Any]) -> None:
    paths = doc["paths"]
    for path, name in SCHEMAS.items():
        operation = paths[path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        assert doc["components"]["schemas"][name]["properties"]["model"]["minLength"] == 1
        statuses = set(operation["responses"])
        assert {"200", "400", "401", "413", "500"} <= statuses and "422" not in statuses
        error = operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert error.endswith("AnthropicError" if path.startswith("/v1/messages") else "OpenAIError")
    for path in ("/v1/messages", "/v1/chat/completions", "/v1/responses"):
        ok = paths[path]["post"]["responses"]["200"]["content"]
        data = ok["text/event-stream"]["schema"]["properties"]["data"]
        event = data["anyOf"][1]["contentSchema"]["anyOf"][0] if "anyOf" in data else data["contentSchema"]
        assert event["$ref"].endswith("StreamEvent") or event["$ref"].endswith("Chunk")
    assert "529" in paths["/v1/messages"]["post"]["responses"]
    assert "503" in paths["/v1/chat/completions"]["post"]["responses"]
    for path in (
        "/v1/models",
        "/backend-api/codex/models",
        "/v1/agent/tool_events",
        "/v1/responses/{response_id}",
    ):
        assert path in paths
    assert not any("422" in op.get("responses", {}) for item in paths.values() for op in item.values())


def test_the_captured_harness_requests_validate(doc: dict[str, Any]) -> None:
    assert len(HARNESS_BODIES) >= 5
    for api, body in HARNESS_BODIES:
        endpoint = HARNESS_ENDPOINT[api]
        errors = list(validator(doc, SCHEMAS[endpoint]).iter_errors(body))
        assert not errors, (api, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:3]])


def test_the_seed_requests_validate(doc: dict[str, Any]) -> None:
    for endpoint, body in SEEDS.items():
        validator(doc, SCHEMAS[endpoint]).validate(body)


def test_what_a_decoder_accepts_the_schema_accepts(doc: dict[str, Any]) -> None:
    """1,200 fuzzed requests per endpoint (seeded): every one the decoder accepts validates."""
    rng = random.Random(23)
    validators = {endpoint: validator(doc, name) for endpoint, name in SCHEMAS.items()}
    accepted = rejected_by_decoder = 0
    for _ in range(1200):
        for endpoint in SCHEMAS:
            request = mutated_request(rng, endpoint)
            try:
                body = parse_json(request.content)  # the edge: JSON, lone surrogates
                DECODERS[endpoint](body)
            except ApiError:
                rejected_by_decoder += 1
                continue
            accepted += 1
            errors = list(validators[endpoint].iter_errors(body))
            assert not errors, (endpoint, [f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors[:3]])
    assert accepted > 500 and rejected_by_decoder > 500  # both sides of the line were exercised


def test_the_schema_refuses_what_the_decoders_refuse_by_type(doc: dict[str, Any]) -> None:
    """Spot checks the other way: wrong types and values the decoders refuse, the schema refuses."""
    messages = validator(doc, "AnthropicMessagesRequest")
    chat = validator(doc, "ChatCompletionRequest")
    responses = validator(doc, "ResponsesRequest")
    anthropic_ok = SEEDS["/v1/messages"]
    for change in (
        {"max_tokens": -1},
        {"max_tokens": True},
        {"temperature": 1.5},
        {"tools": [{"type": "function", "function": {"name": "x"}}]},
        {"tools": [{"name": "x", "description": 7, "input_schema": {}}]},
        {"messages": []},
        {"model": ""},
    ):
        assert not messages.is_valid({**anthropic_ok, **change}), change
    chat_ok = SEEDS["/v1/chat/completions"]
    for change in (
        {"stop": ["a"] * 5},
        {"n": 2},
        {"tool_choice": "sometimes"},
        {"messages": [{"role": "x"}]},
    ):
        assert not chat.is_valid({**chat_ok, **change}), change
    responses_ok = SEEDS["/v1/responses"]
    for change in ({"max_output_tokens": 0}, {"truncation": "yes"}, {"input": 3}, {"background": True}):
        assert not responses.is_valid({**responses_ok, **change}), change


def test_real_answers_validate_against_their_documented_schemas(doc: dict[str, Any]) -> None:
    """Non-streaming bodies, every stream frame's data, and error bodies, as the app sends them."""
    app, _ = build_up(UpConfig.model_validate({"port": 0, "sim_speedup": 0}), keys=ApiKeys())
    headers = {"anthropic-version": "2023-06-01"}
    with TestClient(app) as client:
        for endpoint, body in SEEDS.items():
            operation = doc["paths"][endpoint]["post"]["responses"]
            ok = operation["200"]["content"]
            r = client.post(endpoint, json=body, headers=headers)
            assert r.status_code == 200, r.text
            Draft202012Validator({**doc, **ok["application/json"]["schema"]}).validate(r.json())
            if "text/event-stream" in ok:
                data_schema = ok["text/event-stream"]["schema"]["properties"]["data"]
                event = (
                    data_schema["anyOf"][1]["contentSchema"]
                    if "anyOf" in data_schema
                    else data_schema["contentSchema"]
                )
                frames = client.post(endpoint, json={**body, "stream": True}, headers=headers).text.split(
                    "\n\n"
                )
                datas = [line[6:] for f in frames for line in f.split("\n") if line.startswith("data: ")]
                assert len(datas) > 2
                for data in datas:
                    if data == "[DONE]":
                        assert data_schema["anyOf"][0] == {"const": "[DONE]"}
                    else:
                        Draft202012Validator({**doc, **event}).validate(json.loads(data))
            error = client.post(endpoint, json={**body, "model": ""}, headers=headers)
            assert error.status_code == 400
            Draft202012Validator(
                {**doc, **operation["400"]["content"]["application/json"]["schema"]}
            ).validate(error.json())
