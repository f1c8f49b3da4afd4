"""The frontend's pure pieces: budgets, hints, keys, error shapes, betas, harness settings."""

from __future__ import annotations

import base64
import json
import logging
import re
import tomllib
from pathlib import Path

import pytest

from agentserve.api.errors import (
    AuthenticationError,
    ContextLengthError,
    InvalidRequestError,
    OverloadedError,
)
from agentserve.api.options import GenerationOptions
from agentserve.api.signing import Signer
from agentserve.config import ConfigError, FrontendConfig, UpConfig
from agentserve.conversation import Conversation, Message, Text, ToolResult
from agentserve.families import get_family
from agentserve.frontend.betas import BetaLog
from agentserve.frontend.harness import harness_settings
from agentserve.frontend.http import ApiKeys, error_kind_for, error_response, parse_json
from agentserve.frontend.models import served_models
from agentserve.frontend.plan import generation_hints, output_budget, sampling_params
from agentserve.frontend.up import load_signer
from agentserve.keyfile import fingerprint
from agentserve.router.discovery import kv_endpoint_for


def test_output_budget_clamps_to_the_window_and_refuses_a_full_prompt() -> None:
    assert output_budget(32000, 100_000, 131072) == 31072
    assert output_budget(100, 1000, 131072) == 100
    assert output_budget(None, 1000, 4096) == 3096
    with pytest.raises(ContextLengthError) as info:
        output_budget(10, 4096, 4096)
    assert info.value.message.startswith("prompt is too long: 4096 tokens")
    assert info.value.code == "context_length_exceeded"


def test_sampling_leaves_stop_strings_to_the_frontend() -> None:
    options = GenerationOptions(model="m", temperature=0.3, top_p=0.9, top_k=20, seed=7, stop=("x",))
    params = sampling_params(options, 55)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed) == (
        55,
        0.3,
        0.9,
        20,
        7,
    )
    assert params.stop == ()


def test_hints_name_the_turn_and_the_last_messages() -> None:
    conversation = Conversation(
        messages=(
            Message("user", (Text("run the tests"),)),
            Message("assistant", (Text("ok"),)),
            Message("tool", (ToolResult("call_1", (Text("3 passed"),)),)),
        )
    )
    hints = generation_hints(conversation)
    assert (hints.turn, hints.last_user_message, hints.last_message) == (2, "run the tests", "3 passed")
    assert generation_hints(Conversation()).turn == 1


def test_api_keys_from_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\nsk-one\n\n  sk-two  \n")
    keys = ApiKeys.load(str(path), {"AGENTSERVE_API_KEYS": "sk-three, ,sk-four"})
    assert keys
    for key in ("sk-one", "sk-two", "sk-three", "sk-four"):
        assert keys.check({"x-api-key": key})
        assert keys.check({"authorization": f"Bearer {key}"}) == keys.check({"x-api-key": key})
    assert keys.check({"x-api-key": "sk-one"}) != keys.check({"x-api-key": "sk-two"})  # scopes differ
    with pytest.raises(AuthenticationError):
        keys.check({})
    with pytest.raises(AuthenticationError):
        keys.check({"authorization": "Basic sk-one"})
    with pytest.raises(AuthenticationError):
        keys.check({"x-api-key": "sk-five"})
    assert "sk-one" not in repr(vars(keys))  # only digests are kept
    assert ApiKeys().check({}) == ""  # no keys configured: everyone is welcome, one scope


@pytest.mark.parametrize("body", [b"", b"  ", b"{", b"\xff", b"[" * 50_000])
def test_parse_json_refuses_what_is_not_json(body: bytes) -> None:
    with pytest.raises(InvalidRequestError):
        parse_json(body)


def test_error_shapes_and_statuses() -> None:
    overloaded = OverloadedError("busy")
    anthropic = error_response(overloaded, "anthropic", "req_1")
    openai = error_response(overloaded, "openai", "req_1")
    assert (anthropic.status_code, openai.status_code) == (529, 503)
    assert anthropic.headers["retry-after"] == "1" and anthropic.headers["request-id"] == "req_1"
    body = json.loads(bytes(anthropic.body))
    assert body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy"},
        "request_id": "req_1",
    }
    assert json.loads(bytes(openai.body))["error"]["type"] == "server_error"
    assert error_kind_for("/v1/messages/count_tokens", {}) == "anthropic"
    assert error_kind_for("/v1/models", {"anthropic-version": "2023-06-01"}) == "anthropic"
    assert error_kind_for("/v1/responses", {}) == "openai"


def test_unknown_betas_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="agentserve.frontend")
    betas = BetaLog()
    assert betas.note(["claude-code-20250219, brand-new-2031", "brand-new-2031"]) == ["brand-new-2031"]
    assert betas.note(["brand-new-2031"]) == []
    assert "brand-new-2031" in caplog.text


def test_harness_settings_are_ready_to_paste() -> None:
    text = harness_settings("http://127.0.0.1:8000", "qwen3-sim", keys_required=False)
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:8000\n" in text  # no /v1: Claude Code adds it
    assert "export ANTHROPIC_MODEL=qwen3-sim" in text
    assert "export OPENAI_BASE_URL=http://127.0.0.1:8000/v1" in text
    toml_lines = text.split("~/.codex/config.toml:\n")[1].split("\n\n  then:")[0]
    codex = tomllib.loads("\n".join(line.strip() for line in toml_lines.splitlines()))
    assert codex["model_provider"] == "agentserve"
    provider = codex["model_providers"]["agentserve"]
    assert provider["wire_api"] == "responses" and provider["base_url"] == "http://127.0.0.1:8000/v1"
    assert "<one of your API keys>" in harness_settings("http://h:1", "m", keys_required=True)


def test_served_models_follow_the_family() -> None:
    config = FrontendConfig.model_validate(
        {"model": "qwen3-sim", "model_aliases": ["claude-qwen3"], "context_length": 32768}
    )
    (facts,) = served_models(config, get_family("qwen3"))
    assert facts.ids == ("qwen3-sim", "claude-qwen3") and facts.context_window == 32768 and facts.reasoning
    (llama,) = served_models(FrontendConfig.model_validate({"model": "llama"}), get_family("llama3-json"))
    assert not llama.reasoning and llama.reasoning_levels == ()


def test_kv_endpoint_of_a_worker_bound_to_every_address() -> None:
    kv_endpoint = kv_endpoint_for
    assert kv_endpoint("http://10.0.0.7:8200", "tcp://0.0.0.0:5557") == "tcp://10.0.0.7:5557"
    assert kv_endpoint("http://worker:8200", "tcp://*:5557") == "tcp://worker:5557"
    assert kv_endpoint("http://[::1]:8200", "tcp://[::]:5557") == "tcp://[::1]:5557"
    assert kv_endpoint("http://w:8200", "tcp://192.168.1.2:5557") == "tcp://192.168.1.2:5557"
    with pytest.raises(ValueError, match="tcp://"):  # the router reaches workers across hosts: TCP only
        kv_endpoint("http://w:8200", "ipc:///tmp/kv")


def _signer_of(settings: dict[str, object], environ: dict[str, str] | None = None) -> Signer:
    return load_signer(FrontendConfig.model_validate(settings), environ or {})


def test_signing_key_from_file_environment_or_random(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = bytes(range(32))
    path = tmp_path / "key"
    path.write_text(key.hex() + "\n")  # what the operator's Secret holds
    caplog.set_level(logging.INFO, "agentserve.up")
    from_file = _signer_of({"signing_key_file": str(path)})
    assert from_file.fingerprint == fingerprint(key)
    from_env = _signer_of({}, {"AGENTSERVE_SIGNING_KEY": base64.b64encode(key).decode()})
    assert from_file.sign_thinking("x") == from_env.sign_thinking("x")  # replicas share a key
    assert from_file.sign_thinking("x") == Signer(key).sign_thinking("x")
    raw = tmp_path / "raw"
    raw.write_bytes(bytes(range(200, 240)))
    assert _signer_of({"signing_key_file": str(raw)}).fingerprint == fingerprint(bytes(range(200, 240)))
    random = _signer_of({})
    assert random.sign_thinking("x") != from_file.sign_thinking("x")
    # Only fingerprints reach the log, never the key in any form.
    logged = caplog.text
    assert f"fingerprint {fingerprint(key)}" in logged and f"fingerprint {random.fingerprint}" in logged
    for form in (key.hex(), base64.b64encode(key).decode(), repr(key)):
        assert form not in logged


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"short\n", "too short: 5 bytes"), (b"00112233445566778899\n", "too short: 10 bytes (read as hex)")],
)
def test_a_short_signing_key_is_a_config_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
        _signer_of({"signing_key_file": str(path)})
    with pytest.raises(ConfigError, match=re.escape(f"AGENTSERVE_SIGNING_KEY: signing key {message}")):
        _signer_of({}, {"AGENTSERVE_SIGNING_KEY": content.decode()})


def test_an_unreadable_signing_key_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read signing_key_file"):
        _signer_of({"signing_key_file": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="cannot read signing_key_file"):
        _signer_of({"signing_key_file": str(tmp_path)})  # a directory (a Secret mounted one level off)


def test_up_defaults() -> None:
    config = UpConfig.model_validate({})
    assert (config.host, config.model, config.workers) == ("127.0.0.1", "qwen3-sim", 2)
    assert get_family("qwen3").matches_model(config.model)


def test_family_stop_tokens_go_to_the_engine_as_ids_or_strings_and_stay_in_the_output() -> None:
    from agentserve.api.options import GenerationOptions
    from agentserve.families import get_family
    from agentserve.frontend.plan import engine_stops, sampling_params
    from agentserve.prompt.tokenizer import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    stops = engine_stops(get_family("gpt-oss").stop_tokens, tokenizer.token_id)
    assert stops.token_ids == (tokenizer.token_id("<|call|>"), tokenizer.token_id("<|return|>"))
    assert stops.strings == ()
    # Llama 4's tokens are not in this tokenizer: they go as stop strings.
    pythonic = engine_stops(get_family("pythonic").stop_tokens, tokenizer.token_id)
    assert "<|eot|>" in pythonic.strings and tokenizer.token_id("<|eot_id|>") in pythonic.token_ids
    sampling = sampling_params(GenerationOptions(model="m"), 100, stops)
    assert sampling.stop_token_ids == stops.token_ids and sampling.include_stop
    assert not sampling_params(GenerationOptions(model="m"), 100).include_stop
    # Every family names its turn terminators, the call terminator first.
    from agentserve.families import FAMILIES

    assert all(f.stop_tokens for f in FAMILIES)
