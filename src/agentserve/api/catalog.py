"""Model discovery in each client's shape, from one small typed description of a served model.

- Anthropic `/v1/models` (when `anthropic-version` is sent): `{"data": [{"type": "model", "id",
  "display_name", "created_at", …}], "has_more", "first_id", "last_id"}`, paginated by
  `limit`/`after_id`/`before_id`. Aliases are listed as models of their own, because Claude Code's
  picker only shows ids starting with `claude`.
- OpenAI `/v1/models`: `{"object": "list", "data": [{"id", "object": "model", "created",
  "owned_by"}]}`. With `codex=True` the same body also carries Codex's `{"models": [ModelInfo…]}`,
  so one URL serves OpenAI clients and `model_catalog_url` alike (each reads its own key).
- Codex `ModelInfo` (codex-rs/protocol/src/openai_models.rs): context window, tool-output truncation
  in *tokens* (unknown models fall back to 10 000 *bytes*, which cuts test output and tracebacks far
  too early), reasoning levels and summaries, parallel tool calls, `apply_patch_tool_type: null` (Codex
  0.169.0 refuses "function"; a freeform grammar tool needs constrained decoding we do not promise).

`ModelFacts` is the input; family facts (context windows, reasoning) fill it in later.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentserve.api.errors import InvalidRequestError, ModelNotFoundError

DEFAULT_INSTRUCTIONS = (
    "You are a coding agent working in the user's repository through the tools you are given. "
    "Read before you change, keep changes small and focused, run the project's tests when you can, "
    "and finish with a short summary of what you did and what is left."
)
_EFFORT_WORDS = {
    "none": "No reasoning",
    "minimal": "Minimal reasoning",
    "low": "Fast answers with light reasoning",
    "medium": "Balanced reasoning",
    "high": "Deep reasoning for hard problems",
    "xhigh": "Maximum reasoning",
}


@dataclass(frozen=True, slots=True)
class ModelFacts:
    id: str
    display_name: str = ""
    description: str = ""
    context_window: int = 131072
    max_output_tokens: int | None = None
    created: int = 0  # unix seconds
    owned_by: str = "agentserve"
    reasoning: bool = False  # the model thinks before answering
    reasoning_levels: tuple[str, ...] = ()  # Codex efforts it honours (none … xhigh)
    default_reasoning_level: str | None = None
    parallel_tool_calls: bool = True
    input_modalities: tuple[str, ...] = ("text",)
    tool_output_tokens: int = 10_000  # Codex truncates each tool output to this many tokens
    base_instructions: str = DEFAULT_INSTRUCTIONS
    aliases: tuple[str, ...] = ()  # more ids for the same model (e.g. "claude-qwen3" for the picker)
    priority: int = 1
    shell_type: str = "shell_command"

    @property
    def name(self) -> str:
        return self.display_name or self.id

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


def find_model(models: Sequence[ModelFacts], model_id: str) -> ModelFacts:
    for facts in models:
        if model_id in facts.ids:
            return facts
    raise ModelNotFoundError(model_id)


# -- Anthropic ---------------------------------------------------------------------------------


def _rfc3339(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def anthropic_model(facts: ModelFacts, model_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "model",
        "id": model_id or facts.id,
        "display_name": facts.name,
        "created_at": _rfc3339(facts.created),
        "max_input_tokens": facts.context_window,
        "lifecycle": "active",
    }
    if facts.max_output_tokens is not None:
        body["max_tokens"] = facts.max_output_tokens
    return body


def anthropic_models(
    models: Sequence[ModelFacts],
    *,
    limit: int = 20,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, Any]:
    """One page of `GET /v1/models` in Anthropic's shape."""
    if not 1 <= limit <= 1000:
        raise InvalidRequestError("must be between 1 and 1000", param="limit")
    entries = [(model_id, facts) for facts in models for model_id in facts.ids]
    ids = [model_id for model_id, _ in entries]
    start, end = 0, len(entries)
    if after_id is not None:
        if after_id not in ids:
            raise InvalidRequestError(f"unknown model id {after_id!r}", param="after_id")
        start = ids.index(after_id) + 1
    if before_id is not None:
        if before_id not in ids:
            raise InvalidRequestError(f"unknown model id {before_id!r}", param="before_id")
        end = ids.index(before_id)
    window = entries[start:end]
    if before_id is not None and after_id is None:
        page, has_more = window[-limit:], len(window) > limit
    else:
        page, has_more = window[:limit], len(window) > limit
    data = [anthropic_model(facts, model_id) for model_id, facts in page]
    return {
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


# -- OpenAI ------------------------------------------------------------------------------------


def openai_model(facts: ModelFacts, model_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": model_id or facts.id,
        "object": "model",
        "created": facts.created,
        "owned_by": facts.owned_by,
        "context_window": facts.context_window,  # extra: what vLLM/Dynamo clients look for
    }
    if facts.max_output_tokens is not None:
        body["max_output_tokens"] = facts.max_output_tokens
    return body


def openai_models(models: Sequence[ModelFacts], *, codex: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "object": "list",
        "data": [openai_model(facts, model_id) for facts in models for model_id in facts.ids],
    }
    if codex:
        body["models"] = codex_catalog(models)["models"]
    return body


# -- Codex -------------------------------------------------------------------------------------


def codex_model_info(facts: ModelFacts, slug: str | None = None) -> dict[str, Any]:
    levels = [{"effort": e, "description": _EFFORT_WORDS.get(e, e)} for e in facts.reasoning_levels]
    return {
        "slug": slug or facts.id,
        "display_name": facts.name,
        "description": facts.description or None,
        "default_reasoning_level": facts.default_reasoning_level,
        "supported_reasoning_levels": levels,
        "shell_type": facts.shell_type,
        "visibility": "list",
        "supported_in_api": True,
        "priority": facts.priority,
        "upgrade": None,
        "base_instructions": facts.base_instructions,
        # We mirror raw reasoning into summary parts when asked, so Codex can show it.
        "supports_reasoning_summaries": facts.reasoning,
        "support_verbosity": False,
        "default_verbosity": None,
        # Codex 0.169.0 knows only "freeform" (a Lark-grammar custom tool, which pays off only with
        # grammar-constrained decoding) and refuses the whole catalog on "function"; null gives the
        # model apply_patch through its shell tool.
        "apply_patch_tool_type": None,
        "truncation_policy": {"mode": "tokens", "limit": facts.tool_output_tokens},
        "supports_parallel_tool_calls": facts.parallel_tool_calls,
        "context_window": facts.context_window,
        "auto_compact_token_limit": facts.context_window * 9 // 10,
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": list(facts.input_modalities),
    }


def codex_catalog(models: Sequence[ModelFacts]) -> dict[str, Any]:
    return {"models": [codex_model_info(facts, slug) for facts in models for slug in facts.ids]}
