"""A client generated from `/openapi.json` by a PyPI generator (openapi-python-client), with no
`openai`/`anthropic` SDK, sends a valid request of each API and reads the typed answer."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentserve.config import UpConfig
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.up import build_up

GENERATOR = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(
    GENERATOR is None, reason="openapi-python-client (dev extra) is not installed"
)


@pytest.fixture(scope="module")
def app_client() -> Iterator[TestClient]:
    app, _ = build_up(UpConfig.model_validate({"port": 0, "sim_speedup": 0}), keys=ApiKeys())
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def generated(app_client: TestClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    root = tmp_path_factory.mktemp("generated")
    spec = root / "openapi.json"
    spec.write_text(app_client.get("/openapi.json").text)
    assert GENERATOR is not None
    subprocess.run(
        [
            GENERATOR,
            "generate",
            "--path",
            str(spec),
            "--output-path",
            str(root / "agentserve_client"),
            "--meta",
            "none",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("agentserve_client")
    finally:
        sys.path.remove(str(root))
        for name in [
            m for m in sys.modules if m == "agentserve_client" or m.startswith("agentserve_client.")
        ]:
            del sys.modules[name]


def module(generated: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{generated.__name__}.{name}")


def client_of(generated: ModuleType, app_client: TestClient) -> Any:
    client = generated.Client(base_url=str(app_client.base_url))
    client.set_httpx_client(app_client)  # the in-process app (TestClient is an httpx.Client)
    return client


def test_the_generated_client_sends_an_anthropic_message(
    generated: ModuleType, app_client: TestClient
) -> None:
    models = module(generated, "models")
    create_message = module(generated, "api.anthropic.create_message")
    body = models.AnthropicMessagesRequest(
        model="qwen3-sim",
        max_tokens=16,
        messages=[models.AnthropicUserMessage(role="user", content="hello")],
        tools=[
            models.AnthropicCustomTool(name="Bash", input_schema=models.AnthropicInputSchema(type_="object"))
        ],
    )
    response = create_message.sync_detailed(client=client_of(generated, app_client), body=body)
    assert response.status_code == 200, response.content
    assert isinstance(response.parsed, models.AnthropicMessage) and response.parsed.role == "assistant"
    assert response.parsed.usage.input_tokens > 0

    count_tokens = module(generated, "api.anthropic.count_tokens")
    counted = count_tokens.sync(
        client=client_of(generated, app_client),
        body=models.AnthropicCountTokensRequest(
            model="qwen3-sim", messages=[models.AnthropicUserMessage(role="user", content="hello")]
        ),
    )
    assert isinstance(counted, models.AnthropicCountTokensResponse) and counted.input_tokens > 0


def test_the_generated_client_sends_a_chat_completion(generated: ModuleType, app_client: TestClient) -> None:
    models = module(generated, "models")
    create = module(generated, "api.chat.create_chat_completion")
    body = models.ChatCompletionRequest(
        model="qwen3-sim", max_tokens=16, messages=[models.ChatUserMessage(role="user", content="hello")]
    )
    response = create.sync_detailed(client=client_of(generated, app_client), body=body)
    assert response.status_code == 200, response.content
    assert isinstance(response.parsed, models.ChatCompletion) and response.parsed.choices


def test_the_generated_client_sends_a_response(generated: ModuleType, app_client: TestClient) -> None:
    models = module(generated, "models")
    create = module(generated, "api.responses.create_response")
    item = models.ResponsesMessageItem(role=models.ResponsesMessageItemRole.USER, content="hello")
    body = models.ResponsesRequest(model="qwen3-sim", max_output_tokens=16, input_=[item], store=False)
    response = create.sync_detailed(client=client_of(generated, app_client), body=body)
    assert response.status_code == 200, response.content
    assert isinstance(response.parsed, models.ResponseObject) and response.parsed.object_ == "response"


def test_the_generated_client_reads_errors_and_catalogs(
    generated: ModuleType, app_client: TestClient
) -> None:
    models = module(generated, "models")
    create = module(generated, "api.chat.create_chat_completion")
    bad = models.ChatCompletionRequest(
        model="qwen3-sim", messages=[models.ChatUserMessage(role="user", content="x")], n=1, temperature=1.0
    )
    bad.additional_properties["stop"] = ["a", "b", "c", "d", "e"]  # past the documented maxItems
    response = create.sync_detailed(client=client_of(generated, app_client), body=bad)
    assert response.status_code == 400 and isinstance(response.parsed, models.OpenAIError)
    assert response.parsed.error.param == "stop"
    catalog = module(generated, "api.models.list_codex_models").sync(client=client_of(generated, app_client))
    assert isinstance(catalog, models.CodexCatalog) and catalog.models[0].context_window > 0
