"""The request contract as data: every field the three decoders accept, and what becomes of it.

One rule: a field a request carries either has its **effect** (the row says where), is **refused**
(a 400 in the API's own error shape naming the field), or is **ignored** because ignoring it is
harmless (the row says why). Never a 200 with a field silently dropped.

`tests/unit/api/test_field_contract.py` holds the decoders and the published schema
(`api/schema.py`) to this table: every field path of the request models must have a row here, every
row a field, every key a decoder reads a row, and every `refused` row's probe must be answered 400
naming the field. `docs/api-contract.md` carries the table (generated between markers:
`python -m agentserve.api.contract_docs docs/api-contract.md`; the test fails when it drifts).

Paths: `a.b` an object's field, `a[]` an array's items, `a[tag]` the items whose `type` is `tag`
(`[*]` any other tag). The discriminator `type` of a tagged item is its row. Paths that repeat a
shape (a namespace's tools, tool outputs) are written once (`ALIASES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["effect", "refused", "ignored"]
Api = Literal["anthropic", "chat", "responses"]


@dataclass(frozen=True, slots=True)
class FieldRule:
    path: str
    kind: Kind
    note: str  # effect: where; refused: when and why; ignored: why that is harmless
    # For a refused field: a body fragment (merged into a minimal valid request) that the decoder
    # must answer with a 400 naming the field. None where the refusal needs the engine.
    probe: Mapping[str, Any] | None = None


def _e(path: str, note: str) -> FieldRule:
    return FieldRule(path, "effect", note)


def _i(path: str, note: str) -> FieldRule:
    return FieldRule(path, "ignored", note)


def _r(path: str, note: str, probe: Mapping[str, Any] | None = None) -> FieldRule:
    return FieldRule(path, "refused", note, probe)


_CACHE = "the prefix cache is automatic (block hashes); breakpoints add nothing"

_NVEXT = (
    _e("nvext", "serving hints (Dynamo's `nvext`)"),
    _e("nvext.agent_hints", "router hints"),
    _e("nvext.agent_hints.priority", "router priority queue (`route_request`)"),
    _e("nvext.agent_hints.osl", "router: expected output length"),
    _e(
        "nvext.agent_hints.speculative_prefill",
        "after the turn, the predicted next prompt (this prompt + the answer) is prefilled on the "
        "session's worker (`Frontend._speculate`)",
    ),
    _e("nvext.agent_context", "session identity"),
    _e("nvext.agent_context.session_id", "session id: traces, affinity, drift, retention"),
    _e("nvext.agent_context.parent_session_id", "session tree: retention and placement"),
    _e("nvext.agent_context.trajectory_id", "traces"),
    _e("nvext.cache_salt", "salts the block hashes (KV isolation)"),
    _e("nvext.session_control", "Dynamo's subagent session control (docs/subagents.md)"),
    _e("nvext.session_control.session_id", "session id, as `agent_context.session_id` (which wins)"),
    _e("nvext.session_control.parent_session_id", "session tree: retention and placement"),
    _e("nvext.session_control.action", "`close`: the session's own KV is released after the turn"),
    _i(
        "nvext.session_control.timeout",
        "our retention durations apply (a session's KV is never pinned beyond them)",
    ),
)

# -- Anthropic Messages ---------------------------------------------------------------------------

_A_TEXT = (
    _e("text", "prompt text"),
    _i("cache_control", _CACHE),
    _i("citations", "citations the API returned earlier: the text they annotate is rendered"),
)
_A_IMAGE = (
    _e("source", "image input (refused by text-only templates)"),
    _e("source.type", "`base64` or `url`; others 400"),
    _e("source.media_type", "image input"),
    _e("source.data", "image input"),
    _e("source.url", "image input"),
    _i("cache_control", _CACHE),
)
_A_DOCUMENT = (
    _e("source", "plain-text documents only; other sources 400"),
    _e("source.type", "`text`; others 400"),
    _e("source.data", "rendered as the document's text"),
    _i("source.media_type", "plain text is the only document source accepted: the type adds nothing"),
    _e("title", "rendered before the document's text"),
    _e("context", "rendered before the document's text"),
    _r(
        "citations",
        "`{enabled: true}`: we cannot produce citation blocks; `enabled: false` is accepted",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "d"},
                            "citations": {"enabled": True},
                        }
                    ],
                }
            ]
        },
    ),
    _e("citations.enabled", "`false` only (the refusal above names `citations.enabled`)"),
    _i("cache_control", _CACHE),
)
_A_SEARCH_RESULT = (
    _e("source", "rendered as the result's source line"),
    _e("title", "rendered as the result's title"),
    _e("content", "rendered as the result's text"),
    _e("content[text]", "result text"),
    _e("content[text].text", "result text"),
    _i("content[text].cache_control", _CACHE),
    _i("content[text].citations", "earlier citations: the text is rendered"),
    _r(
        "citations",
        "`{enabled: true}`: we cannot produce citation blocks",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "search_result",
                            "source": "s",
                            "title": "t",
                            "content": [{"type": "text", "text": "x"}],
                            "citations": {"enabled": True},
                        }
                    ],
                }
            ]
        },
    ),
    _e("citations.enabled", "`false` only"),
    _i("cache_control", _CACHE),
)


def _under(prefix: str, rules: tuple[FieldRule, ...]) -> tuple[FieldRule, ...]:
    return tuple(FieldRule(f"{prefix}.{r.path}", r.kind, r.note, r.probe) for r in rules)


_A_CONTENT = "messages[].content"
_A_RESULT = f"{_A_CONTENT}[tool_result].content"
_SERVER_NOTE = (
    "a block of Anthropic's server tools (run on Anthropic's side) in history: nothing our model "
    "produced or can use"
)
_A_SERVER_BLOCKS = (
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "mcp_tool_use",
    "mcp_tool_result", "container_upload", "tool_search_tool_result",
)  # fmt: skip
_CLIENT_TOOL = (
    "tools[client]"  # Anthropic's client-executed tools: bash_…, text_editor_…, memory_…, computer_…
)

ANTHROPIC: tuple[FieldRule, ...] = (
    _e("model", "the served model (any name accepted by default; `accept_any_model`)"),
    _e("max_tokens", "output budget (`plan.output_budget`); 0 is a cache pre-warm"),
    _e("messages", "the conversation"),
    _e("messages[].role", "user / assistant / system (mid-conversation instructions)"),
    _e(_A_CONTENT, "a string or content blocks"),
    _e(f"{_A_CONTENT}[text]", "text"),
    *_under(f"{_A_CONTENT}[text]", _A_TEXT),
    _e(f"{_A_CONTENT}[image]", "image input"),
    *_under(f"{_A_CONTENT}[image]", _A_IMAGE),
    _e(f"{_A_CONTENT}[document]", "rendered: title, context, then the text"),
    *_under(f"{_A_CONTENT}[document]", _A_DOCUMENT),
    _e(f"{_A_CONTENT}[search_result]", "rendered as content: title, source, text"),
    *_under(f"{_A_CONTENT}[search_result]", _A_SEARCH_RESULT),
    _e(f"{_A_CONTENT}[tool_use]", "a call in history"),
    _e(f"{_A_CONTENT}[tool_use].id", "pairs the result"),
    _e(f"{_A_CONTENT}[tool_use].name", "the called tool"),
    _e(f"{_A_CONTENT}[tool_use].input", "the call's arguments"),
    _i(f"{_A_CONTENT}[tool_use].cache_control", _CACHE),
    _i(f"{_A_CONTENT}[tool_use].caller", "programmatic-calling bookkeeping; the call itself is rendered"),
    _e(f"{_A_CONTENT}[tool_result]", "a tool's answer"),
    _e(f"{_A_CONTENT}[tool_result].tool_use_id", "pairs the call"),
    _e(
        f"{_A_CONTENT}[tool_result].is_error",
        "the family template's error field, else the text opens with `[tool error]` (docs/prompt.md)",
    ),
    _i(f"{_A_CONTENT}[tool_result].cache_control", _CACHE),
    _e(_A_RESULT, "the result's content"),
    _e(f"{_A_RESULT}[text]", "text"),
    *_under(f"{_A_RESULT}[text]", _A_TEXT),
    _e(f"{_A_RESULT}[image]", "image"),
    *_under(f"{_A_RESULT}[image]", _A_IMAGE),
    _e(f"{_A_RESULT}[document]", "as a user document"),
    *_under(f"{_A_RESULT}[document]", _A_DOCUMENT),
    _e(f"{_A_RESULT}[search_result]", "as a user search result"),
    *_under(f"{_A_RESULT}[search_result]", _A_SEARCH_RESULT),
    _i(f"{_A_RESULT}[tool_reference]", "tool-search bookkeeping: the referenced tool is already offered"),
    _i(f"{_A_RESULT}[tool_reference].tool_name", "tool-search bookkeeping"),
    _e(f"{_A_CONTENT}[thinking]", "reasoning replay (docs/prompt.md)"),
    _e(f"{_A_CONTENT}[thinking].thinking", "reasoning text"),
    _e(f"{_A_CONTENT}[thinking].signature", "restores our own omitted thinking"),
    _i(f"{_A_CONTENT}[redacted_thinking]", "encrypted by another provider: nothing to render"),
    _i(f"{_A_CONTENT}[redacted_thinking].data", "encrypted by another provider"),
    *(_i(f"{_A_CONTENT}[{kind}]", _SERVER_NOTE) for kind in _A_SERVER_BLOCKS),
    _e("system", "the system prompt (volatile spans stripped first)"),
    _e("system[text]", "system text"),
    _e("system[text].text", "system text"),
    _i("system[text].cache_control", _CACHE),
    _i("system[text].citations", "earlier citations: the text is rendered"),
    _e("tools", "rendered into the prompt by the family template"),
    _e("tools[custom]", "a tool the client runs"),
    _e("tools[custom].name", "tool name"),
    _e("tools[custom].description", "tool description"),
    _e("tools[custom].input_schema", "arguments schema (rendered; enforced when strict)"),
    _e("tools[custom].input_schema.type", "must be `object`"),
    _e("tools[custom].strict", "arguments enforced by the grammar (docs: Constrained decoding)"),
    _i("tools[custom].cache_control", _CACHE),
    _i(
        "tools[custom].defer_loading",
        "tool search: the tool is rendered up front instead of on reference (same calls, longer prompt)",
    ),
    _e(
        _CLIENT_TOOL,
        "Anthropic's client-executed tools (`bash_*`, `text_editor_*`, `memory_*`, `computer_*`): "
        "rendered with the input schema Anthropic documents; calls return as `tool_use`",
    ),
    _e(
        f"{_CLIENT_TOOL}.name",
        "the fixed name Anthropic gives the tool (`bash`, `str_replace_based_edit_tool`, …)",
    ),
    _e(f"{_CLIENT_TOOL}.max_characters", "text editor: rendered in the tool's description"),
    _e(f"{_CLIENT_TOOL}.display_width_px", "computer use: rendered in the tool's description"),
    _e(f"{_CLIENT_TOOL}.display_height_px", "computer use: rendered in the tool's description"),
    _e(f"{_CLIENT_TOOL}.display_number", "computer use: rendered in the tool's description"),
    _i(f"{_CLIENT_TOOL}.cache_control", _CACHE),
    _e(f"{_CLIENT_TOOL}.strict", "arguments enforced by the grammar"),
    _i(
        "tools[*]",
        "a server-executed tool (web search, code execution, …): it runs on Anthropic's side and "
        "cannot run here, so it is not offered; `tool_choice` naming one is a 400",
    ),
    _e("tool_choice", "constrained decoding"),
    _e("tool_choice.type", "auto / any / tool / none"),
    _e("tool_choice.name", "the forced tool (a server tool: 400)"),
    _e("tool_choice.disable_parallel_tool_use", "at most / exactly one call"),
    _e("thinking", "reasoning switch (template's `enable_thinking`)"),
    _e("thinking.type", "enabled / adaptive / disabled"),
    _e("thinking.budget_tokens", "the reasoning block is closed after this many tokens (grammar)"),
    _e("thinking.display", "`omitted`: thinking travels sealed in its signature"),
    _e("output_config", "effort and output format"),
    _e("output_config.effort", "reasoning effort (template knob)"),
    _e("output_config.format", "JSON output (grammar)"),
    _e("output_config.format.type", "`json_schema`"),
    _e("output_config.format.schema", "the enforced schema"),
    _e("stop_sequences", "stop strings"),
    _e("temperature", "sampling"),
    _e("top_p", "sampling"),
    _e("top_k", "sampling"),
    _e("metadata", "identity"),
    _e("metadata.user_id", "session id (Claude Code's JSON user id)"),
    _e("stream", "SSE"),
    _i("cache_control", _CACHE),
    _e(
        "context_management",
        "edits applied to the history before rendering; `applied_edits` in the response",
    ),
    _e("context_management.edits", "applied in order"),
    _e("context_management.edits[clear_tool_uses_20250919]", "clears the oldest tool results"),
    _e("context_management.edits[clear_tool_uses_20250919].trigger", "input_tokens / tool_uses threshold"),
    _e("context_management.edits[clear_tool_uses_20250919].keep", "the most recent tool uses kept"),
    _e("context_management.edits[clear_tool_uses_20250919].clear_at_least", "clear only if this much goes"),
    _e("context_management.edits[clear_tool_uses_20250919].exclude_tools", "tools never cleared"),
    _e("context_management.edits[clear_tool_uses_20250919].clear_tool_inputs", "also clear call inputs"),
    _e("context_management.edits[clear_thinking_20251015]", "drops thinking of older turns"),
    _e("context_management.edits[clear_thinking_20251015].keep", "`all` or the last N thinking turns"),
    _r(
        "context_management.edits[*]",
        "an edit type not implemented (e.g. `compact_20260112`)",
        {"context_management": {"edits": [{"type": "compact_20260112"}]}},
    ),
    *_NVEXT,
    _i("service_tier", "capacity tiers of Anthropic's fleet; a deployment has one"),
    _i("container", "the code-execution container of Anthropic's server tools, which do not run here"),
    _i("inference_geo", "data residency of Anthropic's fleet; we run where deployed"),
    _i(
        "mcp_servers",
        "Anthropic's MCP connector runs server-side; its tools are not offered (as server tools)",
    ),
    _i("betas", "beta flags (the header's list in the body): features are on or refused by field"),
)

# -- Chat Completions -----------------------------------------------------------------------------

_STRICT_TOOL = (
    "arguments enforced by the grammar; the schema must keep OpenAI's strict-mode rules "
    "(`api/strict.py`, else 400)"
)
_C_MSG = "messages[]"
_C_TOOL = "tools[function].function"
CHAT: tuple[FieldRule, ...] = (
    _e("model", "the served model"),
    _e("messages", "the conversation"),
    _e(f"{_C_MSG}.role", "system / developer / user / assistant / tool / function"),
    _e(f"{_C_MSG}.content", "text, or parts"),
    _e(f"{_C_MSG}.content[text]", "text"),
    _e(f"{_C_MSG}.content[text].text", "text"),
    _e(f"{_C_MSG}.content[image_url]", "image input"),
    _e(f"{_C_MSG}.content[image_url].image_url", "image input"),
    _e(f"{_C_MSG}.content[image_url].image_url.url", "image input"),
    _i(f"{_C_MSG}.content[image_url].image_url.detail", "a resolution hint for OpenAI's vision encoder"),
    _e(f"{_C_MSG}.content[refusal]", "rendered as text"),
    _e(f"{_C_MSG}.content[refusal].refusal", "rendered as text"),
    _e(
        f"{_C_MSG}.name",
        "a function message's function; on other roles a participant name no template renders",
    ),
    _e(f"{_C_MSG}.reasoning_content", "reasoning replay"),
    _e(f"{_C_MSG}.reasoning", "reasoning replay (vLLM's name)"),
    _e(f"{_C_MSG}.tool_calls", "calls in history"),
    _e(f"{_C_MSG}.tool_calls[function]", "a function call"),
    _e(f"{_C_MSG}.tool_calls[function].id", "pairs the result"),
    _e(f"{_C_MSG}.tool_calls[function].function", "the call"),
    _e(f"{_C_MSG}.tool_calls[function].function.name", "the called function"),
    _e(f"{_C_MSG}.tool_calls[function].function.arguments", "the arguments"),
    _e(f"{_C_MSG}.tool_calls[custom]", "a custom-tool call (freeform input)"),
    _e(f"{_C_MSG}.tool_calls[custom].id", "pairs the result"),
    _e(f"{_C_MSG}.tool_calls[custom].custom", "the call"),
    _e(f"{_C_MSG}.tool_calls[custom].custom.name", "the called tool"),
    _e(f"{_C_MSG}.tool_calls[custom].custom.input", "the input text"),
    _e(f"{_C_MSG}.tool_call_id", "pairs a tool message with its call"),
    _e(f"{_C_MSG}.function_call", "a legacy call in history"),
    _e(f"{_C_MSG}.function_call.name", "the called function"),
    _e(f"{_C_MSG}.function_call.arguments", "the arguments"),
    _e("tools", "rendered into the prompt"),
    _e("tools[function]", "a function tool"),
    _e(_C_TOOL, "the function"),
    _e(f"{_C_TOOL}.name", "tool name"),
    _e(f"{_C_TOOL}.description", "tool description"),
    _e(f"{_C_TOOL}.parameters", "arguments schema"),
    _e(f"{_C_TOOL}.parameters.type", "must be `object`"),
    _e(
        f"{_C_TOOL}.strict",
        _STRICT_TOOL,
    ),
    _e("tools[custom]", "a custom tool: rendered with one `input` string; calls return as `type: custom`"),
    _e("tools[custom].custom", "the tool"),
    _e("tools[custom].custom.name", "tool name"),
    _e("tools[custom].custom.description", "tool description"),
    _e("tools[custom].custom.format", "text / grammar"),
    _e("tools[custom].custom.format.type", "text / grammar"),
    _e("tools[custom].custom.format.grammar", "the input's grammar, enforced (`api/custom_format.py`)"),
    _e(
        "tools[custom].custom.format.grammar.syntax",
        "`regex` and `lark` enforced on the input (a Lark grammar flattened into its regex; one llguidance "
        "cannot compile, or that is recursive, is a 400)",
    ),
    _e("tools[custom].custom.format.grammar.definition", "the regex or Lark grammar the input must match"),
    _r(
        "tools[*]",
        "a tool type that is neither `function` nor `custom`",
        {"tools": [{"type": "web_search"}]},
    ),
    _e("functions", "legacy tools"),
    _e("functions[].name", "tool name"),
    _e("functions[].description", "tool description"),
    _e("functions[].parameters", "arguments schema"),
    _e("functions[].parameters.type", "must be `object`"),
    _e(
        "functions[].strict",
        _STRICT_TOOL,
    ),
    _e("tool_choice", "constrained decoding"),
    _e("tool_choice.type", "function / custom / allowed_tools (naming a tool of the other kind: 400)"),
    _e("tool_choice.function", "the forced function"),
    _e("tool_choice.function.name", "the forced function"),
    _e("tool_choice.custom", "the forced custom tool"),
    _e("tool_choice.custom.name", "the forced custom tool"),
    _e("tool_choice.allowed_tools", "calls limited to these"),
    _e("tool_choice.allowed_tools.mode", "auto / required"),
    _e("tool_choice.allowed_tools.tools", "the allowed tools"),
    _e("tool_choice.allowed_tools.tools[function]", "an allowed function"),
    _e("tool_choice.allowed_tools.tools[function].function", "an allowed function"),
    _e("tool_choice.allowed_tools.tools[function].function.name", "an allowed function"),
    _e("tool_choice.allowed_tools.tools[custom]", "an allowed custom tool"),
    _e("tool_choice.allowed_tools.tools[custom].custom", "an allowed custom tool"),
    _e("tool_choice.allowed_tools.tools[custom].custom.name", "an allowed custom tool"),
    _e("function_call", "legacy tool_choice"),
    _e("function_call.name", "the forced function"),
    _e("parallel_tool_calls", "at most one call when false (grammar)"),
    _e("stream", "SSE"),
    _e("stream_options", "stream options"),
    _e("stream_options.include_usage", "final usage chunk"),
    _e("max_tokens", "output budget"),
    _e("max_completion_tokens", "output budget"),
    _e("temperature", "sampling"),
    _e("top_p", "sampling"),
    _e("top_k", "sampling (vLLM's extension)"),
    _e("stop", "stop strings"),
    _e("seed", "sampling seed"),
    _e("presence_penalty", "sampling"),
    _e("frequency_penalty", "sampling"),
    _r("n", "only n=1 (one request per choice)", {"n": 2}),
    _e("response_format", "JSON output (grammar)"),
    _e("response_format.type", "text / json_object / json_schema"),
    _e("response_format.json_schema", "the schema"),
    _e("response_format.json_schema.name", "schema name"),
    _e("response_format.json_schema.schema", "the enforced schema"),
    _e(
        "response_format.json_schema.strict",
        "enforced; the schema must keep OpenAI's strict-mode rules (`api/strict.py`, else 400)",
    ),
    _e("reasoning_effort", "reasoning switch and level"),
    _e("chat_template_kwargs", "passed to the template (`enable_thinking`)"),
    _e(
        "logprobs",
        "the answer tokens' log-probabilities (`choices[].logprobs.content`, stream chunks too): the "
        "engine's (the sim: its sampling distribution after grammar mask and bias; TensorRT-LLM: "
        "`SamplingParams.logprobs`)",
    ),
    _e("top_logprobs", "alternatives per token (0..20; needs `logprobs: true`)"),
    _e(
        "logit_bias",
        "added to the logits (the sim's sampler; TensorRT-LLM `embedding_bias`); a token id outside "
        "the model's vocabulary is a 400",
    ),
    _i("user", "an end-user id for OpenAI's abuse monitoring"),
    _i("safety_identifier", "an end-user id for OpenAI's abuse monitoring"),
    _i("store", "OpenAI keeps completions for evals/distillation; nothing here reads them"),
    _i("metadata", "tags for stored completions (checked with OpenAI's limits)"),
    _i("service_tier", "capacity tiers of OpenAI's fleet; a deployment has one"),
    _i("prompt_cache_key", "the prefix cache is automatic; sessions come from headers and nvext"),
    _i("prompt_cache_retention", "the prefix cache's retention is the deployment's (kv_retention)"),
    *_NVEXT,
)

# -- Responses ------------------------------------------------------------------------------------

_R_OUT = "input[function_call_output].output"
_R_MSG = "input[message]"
_R_HOSTED_ITEMS = (
    "web_search_call", "file_search_call", "computer_call", "computer_call_output", "code_interpreter_call",
    "image_generation_call", "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
    "compaction", "tool_search_call", "tool_search_output",
)  # fmt: skip
_HOSTED_NOTE = (
    "an item of OpenAI's hosted tools (run on OpenAI's side): nothing our model produced or can use"
)
RESPONSES: tuple[FieldRule, ...] = (
    _e("model", "the served model"),
    _e("input", "the conversation items"),
    _e(f"{_R_MSG}", "a message"),
    _e(f"{_R_MSG}.role", "user / assistant / system / developer"),
    _e(f"{_R_MSG}.content", "text or parts"),
    _e(f"{_R_MSG}.content[input_text]", "text"),
    _e(f"{_R_MSG}.content[input_text].text", "text"),
    _e(f"{_R_MSG}.content[output_text]", "text"),
    _e(f"{_R_MSG}.content[output_text].text", "text"),
    _i(f"{_R_MSG}.content[output_text].annotations", "annotations of earlier output; its text is rendered"),
    _i(
        f"{_R_MSG}.content[output_text].logprobs", "log-probabilities of earlier output; its text is rendered"
    ),
    _e(f"{_R_MSG}.content[text]", "text"),
    _e(f"{_R_MSG}.content[text].text", "text"),
    _e(f"{_R_MSG}.content[refusal]", "rendered as text"),
    _e(f"{_R_MSG}.content[refusal].refusal", "rendered as text"),
    _e(f"{_R_MSG}.content[input_image]", "image input"),
    _e(f"{_R_MSG}.content[input_image].image_url", "image input"),
    _i(f"{_R_MSG}.content[input_image].detail", "a resolution hint for OpenAI's vision encoder"),
    _i(f"{_R_MSG}.id", "item ids of OpenAI's store; history is sent whole"),
    _i(f"{_R_MSG}.status", "item status of earlier output"),
    _e("input[reasoning]", "reasoning replay"),
    _e("input[reasoning].content", "reasoning text"),
    _e("input[reasoning].content[].text", "reasoning text"),
    _e("input[reasoning].encrypted_content", "our sealed reasoning, unsealed"),
    _i(
        "input[reasoning].summary", "a summary of reasoning whose full text (content / encrypted) is replayed"
    ),
    _e("input[function_call]", "a call in history"),
    _e("input[function_call].call_id", "pairs the output"),
    _e("input[function_call].name", "the called tool"),
    _e("input[function_call].arguments", "the arguments"),
    _e("input[custom_tool_call]", "a custom-tool call in history"),
    _e("input[custom_tool_call].call_id", "pairs the output"),
    _e("input[custom_tool_call].name", "the called tool"),
    _e("input[custom_tool_call].input", "the input text"),
    _e("input[function_call_output]", "a tool's answer"),
    _e("input[function_call_output].call_id", "pairs the call"),
    _e(_R_OUT, "the answer's content"),
    _e(f"{_R_OUT}[input_text]", "text"),
    _e(f"{_R_OUT}[input_text].text", "text"),
    _e(f"{_R_OUT}[output_text]", "text"),
    _e(f"{_R_OUT}[output_text].text", "text"),
    _e(f"{_R_OUT}[text]", "text"),
    _e(f"{_R_OUT}[text].text", "text"),
    _e(f"{_R_OUT}[refusal]", "text"),
    _e(f"{_R_OUT}[refusal].refusal", "text"),
    _e(f"{_R_OUT}[input_image]", "image"),
    _e(f"{_R_OUT}[input_image].image_url", "image"),
    _e("input[custom_tool_call_output]", "a custom tool's answer"),
    _e("input[custom_tool_call_output].call_id", "pairs the call"),
    _i(f"{_R_OUT}[input_image].detail", "a resolution hint for OpenAI's vision encoder"),
    _e("input[local_shell_call]", "a local shell call in history (the `local_shell` tool's call)"),
    _e("input[local_shell_call].call_id", "pairs the output"),
    _e("input[local_shell_call].action", "the call's arguments"),
    _e("input[local_shell_call_output]", "the shell's answer"),
    _e("input[local_shell_call_output].call_id", "pairs the call (OpenAI's SDK names it `id`)"),
    _e("input[local_shell_call_output].id", "pairs the call when `call_id` is absent"),
    _e("input[local_shell_call_output].output", "the answer's text"),
    _e("input[shell_call]", "a shell call in history (the `shell` tool's call)"),
    _e("input[shell_call].call_id", "pairs the output"),
    _e("input[shell_call].action", "the call's arguments"),
    _e("input[shell_call_output]", "the shell's answer"),
    _e("input[shell_call_output].call_id", "pairs the call"),
    _e("input[shell_call_output].output", "per command: stdout, stderr, outcome (rendered as text)"),
    _e("input[apply_patch_call]", "a patch call in history (the `apply_patch` tool's call)"),
    _e("input[apply_patch_call].call_id", "pairs the output"),
    _e("input[apply_patch_call].operation", "the call's arguments"),
    _e("input[apply_patch_call_output]", "the patch's answer"),
    _e("input[apply_patch_call_output].call_id", "pairs the call"),
    _e("input[apply_patch_call_output].status", "`failed` renders as a tool error"),
    _e("input[apply_patch_call_output].output", "the answer's text"),
    *(_i(f"input[{kind}]", _HOSTED_NOTE) for kind in _R_HOSTED_ITEMS),
    _e("input[additional_tools]", "more tools (written as `tools`)"),
    _r(
        "input[item_reference]",
        "send the items themselves",
        {"input": [{"type": "item_reference", "id": "x"}]},
    ),
    _e("instructions", "system text (does not carry over `previous_response_id`)"),
    _e("previous_response_id", "the stored history (scoped per API key)"),
    _e("tools", "rendered into the prompt"),
    _e("tools[function]", "a function tool"),
    _e("tools[function].name", "tool name"),
    _e("tools[function].description", "tool description"),
    _e("tools[function].parameters", "arguments schema"),
    _e("tools[function].parameters.type", "must be `object`"),
    _e(
        "tools[function].strict",
        _STRICT_TOOL,
    ),
    _e("tools[custom]", "a freeform tool: one `input` string; calls return as `custom_tool_call`"),
    _e("tools[custom].name", "tool name"),
    _e("tools[custom].description", "tool description"),
    _e("tools[custom].format", "text / grammar"),
    _e("tools[custom].format.type", "text / grammar"),
    _e(
        "tools[custom].format.syntax",
        "`regex` and `lark` enforced on the input (a Lark grammar flattened into its regex; one llguidance "
        "cannot compile, or that is recursive, is a 400)",
    ),
    _e("tools[custom].format.definition", "the regex or Lark grammar the input must match"),
    _e("tools[namespace]", "a namespace of tools (Codex)"),
    _e("tools[namespace].name", "echoed on calls"),
    _e(
        "tools[local_shell]",
        "rendered as `local_shell` (`command` argv, env, …); calls return as `local_shell_call`",
    ),
    _e("tools[shell]", "rendered as `shell` (`commands`, …); calls return as `shell_call`"),
    _e("tools[apply_patch]", "rendered as `apply_patch` (`operation`); calls return as `apply_patch_call`"),
    _i(
        "tools[*]",
        "a hosted tool (web search, file search, code interpreter, MCP, …): it runs on OpenAI's side "
        "and cannot run here, so it is not offered and the Response does not echo it in `tools`; "
        "`tool_choice` naming one is a 400",
    ),
    _e("tool_choice", "constrained decoding"),
    _e("tool_choice.type", "function / custom / allowed_tools (a hosted tool: 400)"),
    _e("tool_choice.name", "the forced tool"),
    _e("tool_choice.mode", "allowed_tools: auto / required"),
    _e("tool_choice.tools", "allowed_tools: the tools"),
    _e("parallel_tool_calls", "at most one call when false"),
    _e("reasoning", "reasoning options"),
    _e("reasoning.effort", "reasoning switch and level"),
    _e("reasoning.summary", "summary parts mirror the reasoning"),
    _e("reasoning.generate_summary", "older name of `summary`"),
    _e("text", "output options"),
    _e("text.verbosity", "template knob (gpt-oss)"),
    _e("text.format", "JSON output (grammar)"),
    _e("text.format.type", "text / json_object / json_schema"),
    _e("text.format.name", "schema name (echoed)"),
    _e("text.format.schema", "the enforced schema"),
    _e(
        "text.format.strict",
        "enforced; the schema must keep OpenAI's strict-mode rules (`api/strict.py`, else 400)",
    ),
    _e(
        "include",
        "`reasoning.encrypted_content`: sealed reasoning; `message.output_text.logprobs`: the output "
        "text's log-probabilities (`output_text.logprobs`, `response.output_text.delta`); the other "
        "values ask for hosted tools' outputs, which never occur here",
    ),
    _e(
        "top_logprobs",
        "alternatives per token in `output_text.logprobs` (0..20; asks for log-probabilities too)",
    ),
    _e("store", "the response store (`previous_response_id`)"),
    _e("prompt_cache_key", "session id"),
    _e("stream", "SSE"),
    _i("stream_options", "`include_obfuscation`: padding against side channels of OpenAI's network path"),
    _e("max_output_tokens", "output budget"),
    _e("temperature", "sampling"),
    _e("top_p", "sampling"),
    _e("truncation", "`auto`: the oldest items are dropped until the prompt fits"),
    _i("metadata", "echoed in the Response (checked with OpenAI's limits)"),
    _i("user", "an end-user id for OpenAI's abuse monitoring (echoed)"),
    _i("safety_identifier", "an end-user id for OpenAI's abuse monitoring"),
    _i("service_tier", "capacity tiers of OpenAI's fleet; a deployment has one"),
    _i("prompt_cache_retention", "the prefix cache's retention is the deployment's (kv_retention)"),
    _i("client_metadata", "Codex's own tags (mirrored headers)"),
    _i("max_tool_calls", "counts calls of hosted tools, which never run here"),
    _r("background", "background responses are not supported", {"background": True}),
    _r("conversation", "OpenAI's stored conversations are not supported", {"conversation": "conv_1"}),
    _r("prompt", "OpenAI's stored prompts are not supported", {"prompt": {"id": "pmpt_1"}}),
    *_NVEXT,
)

# Keys read inside free-form objects (whose row is the object's): `chat_template_kwargs` is passed to
# the template whole, and its thinking switch also sets the reasoning mode.
FREEFORM_KEYS: Mapping[Api, Mapping[str, str]] = {
    "anthropic": {},
    "chat": {"enable_thinking": "chat_template_kwargs", "thinking": "chat_template_kwargs"},
    # A shell call's results are rendered as text (stdout, stderr, how the command ended).
    "responses": dict.fromkeys(
        ("stdout", "stderr", "outcome", "exit_code"), "input[shell_call_output].output"
    ),
}

TABLES: Mapping[Api, tuple[FieldRule, ...]] = {"anthropic": ANTHROPIC, "chat": CHAT, "responses": RESPONSES}

# Shapes written once: a path under the key is classified by the row under the value.
ALIASES: Mapping[Api, Mapping[str, str]] = {
    "anthropic": {},
    "chat": {},
    "responses": {
        "input[additional_tools].tools": "tools",
        "tools[namespace].tools": "tools",
        "input[custom_tool_call_output].output": _R_OUT,
    },
}


def canonical(api: Api, path: str) -> str:
    """The row path that classifies `path` (aliases applied, repeatedly: namespaces nest)."""
    changed = True
    while changed:
        changed = False
        for prefix, target in ALIASES[api].items():
            if path == prefix or path.startswith((prefix + ".", prefix + "[")):
                path = target + path[len(prefix) :]
                changed = True
    return path


def rule(api: Api, path: str) -> FieldRule | None:
    return _INDEX[api].get(canonical(api, path))


def top_level(api: Api) -> frozenset[str]:
    """The top-level fields the API's decoder knows (every row without a `.` or `[`)."""
    return frozenset(r.path for r in TABLES[api] if "." not in r.path and "[" not in r.path)


def ignored_top_level(api: Api) -> frozenset[str]:
    return frozenset(r.path for r in TABLES[api] if r.kind == "ignored" and r.path in top_level(api))


_INDEX: Mapping[Api, Mapping[str, FieldRule]] = {
    api: {r.path: r for r in rows} for api, rows in TABLES.items()
}

# -- the documentation ----------------------------------------------------------------------------

BEGIN = "<!-- field-table:begin -->"
END = "<!-- field-table:end -->"
_TITLES = {"anthropic": "Anthropic Messages", "chat": "Chat Completions", "responses": "Responses"}


def markdown() -> str:
    lines: list[str] = []
    for api, rows in TABLES.items():
        counts = {k: sum(1 for r in rows if r.kind == k) for k in ("effect", "refused", "ignored")}
        lines += [
            f"#### {_TITLES[api]} ({len(rows)} fields: {counts['effect']} effect, "
            f"{counts['refused']} refused, {counts['ignored']} ignored)",
            "",
            "| field | kind | where / why |",
            "|---|---|---|",
        ]
        lines += [f"| `{r.path}` | {r.kind} | {r.note.replace('|', '/')} |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def with_table(text: str) -> str:
    """`text` (docs/api-contract.md) with the generated table between its markers."""
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise ValueError("the field-table markers are missing")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError("the field-table end marker is missing")
    return f"{head}{BEGIN}\n\n{markdown()}\n{END}{tail}"
