"""Ready-to-paste settings that point each harness at a running agentserve (pure text)."""

from __future__ import annotations


def harness_settings(base_url: str, model: str, *, keys_required: bool) -> str:
    """Claude Code environment, a Codex `config.toml`, and an OpenAI base URL for `base_url`."""
    key = "<one of your API keys>" if keys_required else "agentserve"
    note = "" if keys_required else "   # any value: no API keys are configured"
    return f"""\
Claude Code (Anthropic Messages):
  export ANTHROPIC_BASE_URL={base_url}
  export ANTHROPIC_API_KEY={key}{note}
  export ANTHROPIC_MODEL={model}
  export ANTHROPIC_DEFAULT_HAIKU_MODEL={model}
  export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
  claude

Codex (OpenAI Responses), in ~/.codex/config.toml:
  model = "{model}"
  model_provider = "agentserve"

  [model_providers.agentserve]
  name = "agentserve"
  base_url = "{base_url}/v1"
  env_key = "AGENTSERVE_API_KEY"
  wire_api = "responses"

  then: export AGENTSERVE_API_KEY={key}; codex
  (model catalog: curl -s {base_url}/v1/models > ~/.codex/agentserve-models.json and set
   model_catalog_json = "<that absolute path>")

OpenAI-compatible clients (Chat Completions and Responses: pi, OpenClaw, the SDKs):
  export OPENAI_BASE_URL={base_url}/v1
  export OPENAI_API_KEY={key}
  model: {model}
"""
