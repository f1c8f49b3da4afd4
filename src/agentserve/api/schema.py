"""The published contract: request, response, stream-event and error bodies as pydantic models.

These models exist for `/openapi.json` only. The request path never runs them: the codecs'
hand-written decoders (`api/*/decode.py`, plain type checks with JSON paths) are faster, and they
decide. The models are written to describe **exactly what the decoders accept** — every field a
decoder reads, with its type, range and enum; unknown fields allowed, as the decoders ignore them —
and `tests/unit/api/test_schema.py` holds them to it on the captured harness requests and on fuzzed
ones (whatever a decoder accepts, the schema accepts). What a type cannot say (a `tool_result`
answering an earlier `tool_use`, `budget_tokens` < `max_tokens`) the decoder checks and the schema's
descriptions say.

Optional fields accept `null` (the decoders treat a null as absent). Integers accept integral
floats (`1024.0`, as JSON Schema's `integer` does).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

NonEmpty = Annotated[str, Field(min_length=1)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Json = dict[str, Any]


class _Open(BaseModel):
    """Unknown fields are allowed: the decoders ignore them (and log them at debug)."""

    model_config = ConfigDict(extra="allow", regex_engine="python-re")  # patterns use look-ahead


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- shared ---------------------------------------------------------------------------------------

_ID_PATTERN = r"^[A-Za-z0-9._:@/+=#~-]{1,128}$"


class AgentHints(_Open):
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    osl: Annotated[int, Field(ge=0, le=1 << 24)] | None = Field(None, description="expected output tokens")
    speculative_prefill: bool | None = None


class AgentContext(_Open):
    session_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None
    parent_session_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None
    trajectory_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None


class SessionControl(_Open):
    """Dynamo's experimental `session_control`: ids complete `agent_context`; `close` releases the
    session's own KV after this turn (docs/subagents.md); `timeout` has no effect here."""

    session_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None
    parent_session_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None
    action: Literal["open", "bind", "close"] | None = None
    timeout: Annotated[int, Field(ge=0, le=2**32 - 1)] | None = None


class NvExt(_Open):
    """Serving hints (Dynamo's `nvext`): priority and expected output length for the router,
    session ids, a cache salt, Dynamo's session control."""

    agent_hints: AgentHints | None = None
    agent_context: AgentContext | None = None
    cache_salt: str | None = None
    session_control: SessionControl | None = None


Temperature1 = Annotated[float, Field(ge=0, le=1)]
Temperature2 = Annotated[float, Field(ge=0, le=2)]
Probability = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]


# -- Anthropic Messages -----------------------------------------------------------------------------


class AnthropicTextBlock(_Open):
    type: Literal["text"]
    text: str
    cache_control: Any = None
    citations: Any = Field(None, description="citations of an earlier answer (ignored)")


class AnthropicBase64Source(_Open):
    type: Literal["base64"]
    media_type: str
    data: str


class AnthropicUrlSource(_Open):
    type: Literal["url"]
    url: NonEmpty


class AnthropicImageBlock(_Open):
    type: Literal["image"]
    source: AnthropicBase64Source | AnthropicUrlSource
    cache_control: Any = None


class AnthropicTextSource(_Open):
    type: Literal["text"]
    data: str
    media_type: str | None = None


class AnthropicCitationsConfig(_Open):
    enabled: Literal[False] | None = Field(None, description="`true` is refused: no citation blocks")


class AnthropicDocumentBlock(_Open):
    """Plain-text documents only (PDF and file sources are refused)."""

    type: Literal["document"]
    source: AnthropicTextSource
    title: str | None = None
    context: str | None = None
    citations: AnthropicCitationsConfig | None = None
    cache_control: Any = None


class AnthropicSearchResultBlock(_Open):
    type: Literal["search_result"]
    source: str
    title: str
    content: list[AnthropicTextBlock]
    citations: AnthropicCitationsConfig | None = None
    cache_control: Any = None


class AnthropicToolReferenceBlock(_Open):
    type: Literal["tool_reference"]
    tool_name: Any = None


AnthropicResultContent = (
    AnthropicTextBlock
    | AnthropicImageBlock
    | AnthropicDocumentBlock
    | AnthropicSearchResultBlock
    | AnthropicToolReferenceBlock
)


class AnthropicToolResultBlock(_Open):
    """Answers the `tool_use` with this id in an earlier assistant turn."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[AnthropicResultContent] | None = None
    is_error: bool | None = None
    cache_control: Any = None


class AnthropicToolUseBlock(_Open):
    type: Literal["tool_use"]
    id: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]+$", description="unique in the request")]
    name: NonEmpty
    input: Json
    cache_control: Any = None
    caller: Any = None


class AnthropicThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class AnthropicRedactedThinkingBlock(_Open):
    type: Literal["redacted_thinking"]
    data: str | None = None


class AnthropicServerBlock(_Open):
    """Blocks of Anthropic's server tools in history: accepted and ignored."""

    type: Literal[
        "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
        "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "mcp_tool_use",
        "mcp_tool_result", "container_upload", "tool_search_tool_result",
    ]  # fmt: skip


AnthropicUserBlock = (
    AnthropicTextBlock
    | AnthropicImageBlock
    | AnthropicDocumentBlock
    | AnthropicToolResultBlock
    | AnthropicServerBlock
    | AnthropicSearchResultBlock
)
AnthropicAssistantBlock = (
    AnthropicTextBlock
    | AnthropicThinkingBlock
    | AnthropicRedactedThinkingBlock
    | AnthropicToolUseBlock
    | AnthropicServerBlock
)


class AnthropicUserMessage(_Open):
    role: Literal["user"]
    content: str | Annotated[list[AnthropicUserBlock], Field(min_length=1)]


class AnthropicAssistantMessage(_Open):
    role: Literal["assistant"]
    content: str | list[AnthropicAssistantBlock]


class AnthropicSystemMessage(_Open):
    """A system message inside `messages` (an extension: mid-conversation instructions)."""

    role: Literal["system"]
    content: str | list[AnthropicTextBlock]


class AnthropicInputSchema(_Open):
    """A JSON Schema of an object (Anthropic requires `type: object`; one without `type` is
    accepted here)."""

    type: Literal["object"] = "object"


class OpenAIParameters(_Open):
    """A JSON Schema of an object; `{}` is a function without parameters."""

    type: Literal["object"] = "object"


class AnthropicCustomTool(_Open):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(min_length=1, max_length=256, description="unique in the request")]
    description: str | None = None
    input_schema: AnthropicInputSchema
    strict: bool | None = None
    cache_control: Any = None
    defer_loading: Any = None


class AnthropicClientTool(_Open):
    """Anthropic's client-executed tools (`bash_20250124`, `text_editor_20250728`, `memory_20250818`,
    `computer_20250124`, …): rendered with the input schema Anthropic documents; the client runs them."""

    contract_tag: ClassVar[str] = "client"
    type: Annotated[str, Field(pattern=r"^(bash|text_editor|memory|computer)_\d{8}$")]
    name: NonEmpty
    max_characters: Annotated[int, Field(ge=1)] | None = None
    display_width_px: Annotated[int, Field(ge=1)] | None = None
    display_height_px: Annotated[int, Field(ge=1)] | None = None
    display_number: Annotated[int, Field(ge=0)] | None = None
    cache_control: Any = None
    strict: bool | None = None


class AnthropicServerTool(_Open):
    """Anthropic's server-executed tools (`web_search_20250305`, …): not offered (they cannot run
    here); a `tool_choice` naming one is a 400."""

    type: Annotated[
        str, Field(pattern=r"^(?!(bash|text_editor|memory|computer)_)([a-z][a-z0-9_]*_\d{8}|mcp_toolset)$")
    ]


class AnthropicClearToolUsesEdit(_Open):
    type: Literal["clear_tool_uses_20250919"]
    trigger: Json | None = Field(
        None, description="{type: input_tokens|tool_uses, value}; default 100000 input tokens"
    )
    keep: Json | None = Field(None, description="{type: tool_uses, value}; default 3")
    clear_at_least: Json | None = Field(None, description="{type: input_tokens, value}")
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = None


class AnthropicClearThinkingEdit(_Open):
    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"] | Json | None = Field(None, description="'all' or {type: thinking_turns, value}")


class AnthropicOtherEdit(_Open):
    """Any other edit type is refused (400)."""

    type: Annotated[str, Field(pattern=r"^(?!(clear_tool_uses_20250919|clear_thinking_20251015)$)")]


class AnthropicContextManagement(_Open):
    edits: list[AnthropicClearToolUsesEdit | AnthropicClearThinkingEdit | AnthropicOtherEdit] | None = None


class AnthropicToolChoiceMode(_Open):
    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: bool | None = None


class AnthropicToolChoiceTool(_Open):
    type: Literal["tool"]
    name: Annotated[str, Field(min_length=1, description="a tool in `tools`")]
    disable_parallel_tool_use: bool | None = None


class AnthropicThinkingEnabled(_Open):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1024, description="at least 1024 and less than max_tokens")]


class AnthropicThinkingAdaptive(_Open):
    type: Literal["adaptive"]
    display: str | None = Field(None, description="'omitted': thinking travels sealed in its signature")


class AnthropicThinkingDisabled(_Open):
    type: Literal["disabled"]


class AnthropicJsonSchemaFormat(_Open):
    type: Literal["json_schema"]
    schema_: Json = Field(alias="schema")


class AnthropicOutputConfig(_Open):
    effort: Literal["low", "medium", "high", "max", "xhigh"] | None = None
    format: AnthropicJsonSchemaFormat | None = None


class AnthropicMetadata(_Open):
    user_id: Annotated[str, Field(max_length=4096)] | None = None


class _AnthropicBody(_Open):
    model: Name
    messages: Annotated[
        list[AnthropicUserMessage | AnthropicAssistantMessage | AnthropicSystemMessage], Field(min_length=1)
    ]
    system: str | list[AnthropicTextBlock] | None = None
    tools: list[AnthropicCustomTool | AnthropicClientTool | AnthropicServerTool] | None = None
    tool_choice: AnthropicToolChoiceMode | AnthropicToolChoiceTool | None = None
    thinking: AnthropicThinkingEnabled | AnthropicThinkingAdaptive | AnthropicThinkingDisabled | None = None
    output_config: AnthropicOutputConfig | None = None
    stop_sequences: list[str] | None = None
    temperature: Temperature1 | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: AnthropicMetadata | None = None
    stream: bool | None = None
    cache_control: Json | None = Field(
        None, description="accepted, ignored: the prefix cache needs no breakpoints"
    )
    context_management: AnthropicContextManagement | None = None
    nvext: NvExt | None = None
    service_tier: Any = Field(None, description="ignored")
    container: Any = Field(None, description="ignored (server tools' container)")
    inference_geo: Any = Field(None, description="ignored")
    mcp_servers: Any = Field(None, description="ignored: MCP servers run on Anthropic's side")
    betas: Any = Field(None, description="ignored")


class AnthropicMessagesRequest(_AnthropicBody):
    """`POST /v1/messages`. `max_tokens: 0` is a cache pre-warm (prefill only), refused with
    `stream`, thinking or `output_config.format`, as Anthropic does."""

    max_tokens: Annotated[int, Field(ge=0)]


class AnthropicCountTokensRequest(_AnthropicBody):
    """`POST /v1/messages/count_tokens`: the Messages body; `max_tokens` is optional."""

    max_tokens: Annotated[int, Field(ge=0)] | None = None


class AnthropicUsage(_Open):
    input_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens: int


class AnthropicResponseToolUse(_Open):
    type: Literal["tool_use"]
    id: str
    name: str
    input: Json


class AnthropicResponseThinking(_Open):
    type: Literal["thinking"]
    thinking: str
    signature: str


class AnthropicMessage(_Open):
    """The non-streaming answer of `/v1/messages`."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[AnthropicTextBlock | AnthropicResponseThinking | AnthropicResponseToolUse]
    stop_reason: (
        Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"] | None
    )
    stop_sequence: str | None
    usage: AnthropicUsage
    context_management: Json | None = Field(
        None, description="`{applied_edits: [...]}` when the request asked for context edits"
    )


class AnthropicCountTokensContext(_Closed):
    original_input_tokens: int = Field(description="before the request's context edits")


class AnthropicCountTokensResponse(_Closed):
    input_tokens: int = Field(description="after the request's context edits, as /v1/messages sends it")
    context_management: AnthropicCountTokensContext | None = None


class AnthropicStreamEvent(_Open):
    """One SSE frame's data (`event:` repeats `type`): `message_start`, `content_block_start`,
    `content_block_delta` (`text_delta`, `thinking_delta`, `signature_delta`, `input_json_delta`),
    `content_block_stop`, `message_delta`, `message_stop`, `ping`, `error`. Ends with `message_stop`,
    or after a failure with `error`."""

    type: Literal[
        "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop", "ping", "error",
    ]  # fmt: skip
    index: int | None = None
    message: AnthropicMessage | None = None
    content_block: Json | None = None
    delta: Json | None = None
    usage: AnthropicUsage | None = None
    error: Json | None = None


class AnthropicErrorDetail(_Open):
    type: Literal[
        "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
        "request_too_large", "rate_limit_error", "api_error", "overloaded_error", "timeout_error",
    ]  # fmt: skip
    message: str


class AnthropicError(_Open):
    """Every Anthropic error: the field at fault prefixes the message (`tools[0].name: …`)."""

    type: Literal["error"]
    error: AnthropicErrorDetail
    request_id: str | None = None


# -- OpenAI Chat Completions ------------------------------------------------------------------------


class ChatTextPart(_Open):
    type: Literal["text"]
    text: str


class ChatImageUrl(_Open):
    url: str
    detail: Any = None


class ChatImagePart(_Open):
    type: Literal["image_url"]
    image_url: str | ChatImageUrl


class ChatRefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


class ChatFunctionCall(_Open):
    name: NonEmpty
    arguments: str | Json | None = Field(None, description="a JSON string (an object is accepted too)")


class ChatToolCall(_Open):
    id: Annotated[str, Field(min_length=1, description="unique in the request")]
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatCustomCall(_Open):
    name: NonEmpty
    input: str


class ChatCustomToolCall(_Open):
    id: Annotated[str, Field(min_length=1, description="unique in the request")]
    type: Literal["custom"]
    custom: ChatCustomCall


class ChatLegacyFunctionCall(_Open):
    name: str
    arguments: str = "{}"


class ChatSystemMessage(_Open):
    role: Literal["system", "developer"]
    content: str | list[ChatTextPart | ChatRefusalPart] | None = None


class ChatUserMessage(_Open):
    role: Literal["user"]
    content: str | list[ChatTextPart | ChatImagePart]


class ChatAssistantMessage(_Open):
    role: Literal["assistant"]
    content: str | list[ChatTextPart | ChatRefusalPart] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ChatToolCall | ChatCustomToolCall] | None = None
    function_call: ChatLegacyFunctionCall | None = None


class ChatToolMessage(_Open):
    role: Literal["tool"]
    tool_call_id: Annotated[str, Field(description="a call of an earlier assistant message")]
    content: str | list[ChatTextPart | ChatImagePart] | None = None


class ChatFunctionMessage(_Open):
    role: Literal["function"]
    name: str
    content: str | list[ChatTextPart | ChatRefusalPart] | None = None


class ChatFunctionDef(_Open):
    name: Annotated[str, Field(min_length=1, max_length=256, description="unique in the request")]
    description: str | None = None
    parameters: OpenAIParameters | None = None
    strict: bool | None = None


class ChatFunctionTool(_Open):
    type: Literal["function"] = "function"
    function: ChatFunctionDef


class ChatCustomTextFormat(_Open):
    type: Literal["text"]


class ChatCustomGrammar(_Open):
    syntax: Literal["lark", "regex"]
    definition: str


class ChatCustomGrammarFormat(_Open):
    """The input must match the regex / be in the Lark grammar's language (enforced)."""

    type: Literal["grammar"]
    grammar: ChatCustomGrammar


class ChatCustomDef(_Open):
    name: Annotated[str, Field(min_length=1, max_length=256, description="unique in the request")]
    description: str | None = None
    format: ChatCustomTextFormat | ChatCustomGrammarFormat | None = None


class ChatCustomTool(_Open):
    """A freeform tool: the model writes one input string; calls come back as `type: custom`."""

    type: Literal["custom"]
    custom: ChatCustomDef


class ChatOtherTool(_Open):
    """A tool of another type is refused (400)."""

    type: Annotated[str, Field(pattern=r"^(?!(function|custom)$)")]


class ChatNamedFunction(_Open):
    name: NonEmpty


class ChatToolChoiceFunction(_Open):
    type: Literal["function"]
    function: ChatNamedFunction


class ChatToolChoiceCustom(_Open):
    type: Literal["custom"]
    custom: ChatNamedFunction


class ChatAllowedFunction(_Open):
    type: Literal["function"]
    function: ChatNamedFunction


class ChatAllowedCustom(_Open):
    type: Literal["custom"]
    custom: ChatNamedFunction


class ChatAllowedTools(_Open):
    mode: Literal["auto", "required"]
    tools: list[ChatAllowedFunction | ChatAllowedCustom] = Field(
        description="tools in `tools` the model may call"
    )


ChatToolChoiceMode = Literal["auto", "none", "required"]


class ChatToolChoiceAllowed(_Open):
    type: Literal["allowed_tools"]
    allowed_tools: ChatAllowedTools


class ChatStreamOptions(_Open):
    include_usage: bool | None = None


class ChatJsonSchema(_Open):
    name: NonEmpty
    schema_: Json | None = Field(None, alias="schema")
    strict: bool | None = None


class ChatResponseFormatSimple(_Open):
    type: Literal["text", "json_object"]


class ChatResponseFormatJsonSchema(_Open):
    type: Literal["json_schema"]
    json_schema: ChatJsonSchema


# OpenAI's `metadata` (Chat and Responses): at most 16 pairs, keys ≤ 64 characters, string values ≤ 512.
OpenAIMetadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(
        max_length=16, description="at most 16 pairs; keys at most 64 characters, string values at most 512"
    ),
]


class ChatCompletionRequest(_Open):
    """`POST /v1/chat/completions`. A named `tool_choice` must name a function in `tools`."""

    model: Name
    messages: Annotated[
        list[
            ChatSystemMessage | ChatUserMessage | ChatAssistantMessage | ChatToolMessage | ChatFunctionMessage
        ],
        Field(min_length=1),
    ]
    tools: (
        Annotated[list[ChatFunctionTool | ChatCustomTool | ChatOtherTool], Field(max_length=128)] | None
    ) = None
    functions: list[ChatFunctionDef] | None = None
    tool_choice: (
        Literal["auto", "none", "required"]
        | ChatToolChoiceFunction
        | ChatToolChoiceCustom
        | ChatToolChoiceAllowed
        | None
    ) = None
    function_call: Literal["auto", "none", "required"] | ChatNamedFunction | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    stream_options: ChatStreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=0)] | None = None
    temperature: Temperature2 | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Literal[1] | None = None
    response_format: ChatResponseFormatSimple | ChatResponseFormatJsonSchema | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: Json | None = Field(None, description="enable_thinking / thinking: bool")
    user: str | None = None
    metadata: OpenAIMetadata | None = None
    nvext: NvExt | None = None
    logprobs: bool | None = Field(None, description="the answer tokens' log-probabilities")
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = Field(
        None, description="alternatives per token (needs `logprobs: true`)"
    )
    logit_bias: (
        Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=300)] | None
    ) = Field(None, description="token id → bias added to its logit")
    safety_identifier: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None


class ChatResponseMessage(_Open):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ChatToolCall] | None = None


class ChatChoice(_Open):
    index: int
    message: ChatResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter"] | None


class ChatUsage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage


class ChatCompletionChunk(_Open):
    """One `data:` frame of a Chat stream; the stream ends with `data: [DONE]` (after an error
    chunk `{"error": {…}}` too). With dispatch on, `event: tool_call_dispatch` frames announce each
    finished call."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[Json]
    usage: ChatUsage | None = None


class OpenAIErrorDetail(_Open):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(_Open):
    """Every OpenAI error (Chat, Responses, models, tool events): `param` is the field's JSON path."""

    error: OpenAIErrorDetail


# -- OpenAI Responses -------------------------------------------------------------------------------


class ResponsesTextPart(_Open):
    type: Literal["input_text", "output_text", "text"]
    text: str


class ResponsesRefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


class ResponsesImagePart(_Open):
    type: Literal["input_image"]
    image_url: str = Field(description="a URL or data: URL (file_id is not supported)")
    detail: Any = None


class ResponsesOutputTextPart(_Open):
    type: Literal["output_text"]
    text: str
    annotations: Any = None
    logprobs: Any = None


ResponsesPart = ResponsesTextPart | ResponsesRefusalPart | ResponsesImagePart


class ResponsesMessageItem(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesOutputTextPart | ResponsesPart]
    id: Any = None
    status: Any = None


class ResponsesReasoningText(_Open):
    text: str


class ResponsesReasoningItem(_Open):
    type: Literal["reasoning"]
    content: list[ResponsesReasoningText] | None = None
    summary: list[Any] | None = None
    encrypted_content: str | None = None


class ResponsesFunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, description="unique in the request")]
    name: NonEmpty
    arguments: str


class ResponsesCustomToolCallItem(_Open):
    type: Literal["custom_tool_call"]
    call_id: NonEmpty
    name: NonEmpty
    input: str


class ResponsesCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(description="a call earlier in the input (or the previous response)")]
    output: str | list[ResponsesPart]


class ResponsesCustomCallOutputItem(_Open):
    type: Literal["custom_tool_call_output"]
    call_id: Annotated[str, Field(description="a call earlier in the input (or the previous response)")]
    output: str | list[ResponsesPart]


class ResponsesLocalShellCallItem(_Open):
    type: Literal["local_shell_call"]
    call_id: NonEmpty
    action: Json = Field(
        description="{type: exec, command: [argv], env, working_directory, timeout_ms, user}"
    )


class ResponsesLocalShellOutputItem(_Open):
    type: Literal["local_shell_call_output"]
    call_id: NonEmpty | None = None
    id: NonEmpty | None = Field(None, description="the call's id when call_id is absent")
    output: str


class ResponsesShellCallItem(_Open):
    type: Literal["shell_call"]
    call_id: NonEmpty
    action: Json = Field(description="{commands: [str], timeout_ms, max_output_length}")


class ResponsesShellOutputItem(_Open):
    type: Literal["shell_call_output"]
    call_id: NonEmpty
    output: list[Json] = Field(description="per command: {stdout, stderr, outcome}")


class ResponsesApplyPatchCallItem(_Open):
    type: Literal["apply_patch_call"]
    call_id: NonEmpty
    operation: Json = Field(description="{type: create_file|update_file|delete_file, path, diff}")


class ResponsesApplyPatchOutputItem(_Open):
    type: Literal["apply_patch_call_output"]
    call_id: NonEmpty
    status: Literal["completed", "failed"] | None = None
    output: str | None = None


class ResponsesItemReference(_Open):
    """Refused (400): send the items themselves."""

    type: Literal["item_reference"]


class ResponsesHostedItem(_Open):
    """Items of OpenAI's hosted tools in history: accepted and ignored."""

    type: Literal[
        "web_search_call", "file_search_call", "computer_call", "computer_call_output",
        "code_interpreter_call", "image_generation_call",
        "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "compaction",
        "tool_search_call", "tool_search_output",
    ]  # fmt: skip


class ResponsesFunctionTool(_Open):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=256, description="unique in the request")]
    description: str | None = None
    parameters: OpenAIParameters | None = None
    strict: bool | None = None


class ResponsesCustomTextFormat(_Open):
    type: Literal["text"]


class ResponsesCustomGrammarFormat(_Open):
    """`regex`: the whole input must match; `lark`: the input is in the grammar's language (both enforced)."""

    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class ResponsesCustomTool(_Open):
    type: Literal["custom"]
    name: Annotated[str, Field(min_length=1, max_length=256, description="unique in the request")]
    description: str | None = None
    format: ResponsesCustomTextFormat | ResponsesCustomGrammarFormat | None = None


class ResponsesShellTool(_Open):
    """OpenAI's client-executed tools: rendered to the model, their calls returned in their own items."""

    type: Literal["local_shell", "shell", "apply_patch"]


_CLIENT_TYPES = "function|custom|local_shell|shell|apply_patch"


class ResponsesHostedTool(_Open):
    """A hosted tool (`web_search`, …): not offered (it cannot run here); tool_choice naming it: 400."""

    type: Annotated[str, Field(pattern=rf"^(?!({_CLIENT_TYPES}|namespace)$)")]


class ResponsesNamespacedHostedTool(_Open):
    type: Annotated[str, Field(pattern=rf"^(?!({_CLIENT_TYPES})$)")]


class ResponsesNamespaceTool(_Open):
    type: Literal["namespace"]
    name: NonEmpty
    tools: list[ResponsesFunctionTool | ResponsesCustomTool | ResponsesNamespacedHostedTool] | None = None


ResponsesTool = (
    ResponsesFunctionTool
    | ResponsesCustomTool
    | ResponsesShellTool
    | ResponsesNamespaceTool
    | ResponsesHostedTool
)


class ResponsesAdditionalToolsItem(_Open):
    type: Literal["additional_tools"]
    tools: list[ResponsesTool] | None = None


ResponsesItem = (
    ResponsesMessageItem
    | ResponsesReasoningItem
    | ResponsesFunctionCallItem
    | ResponsesCustomToolCallItem
    | ResponsesCallOutputItem
    | ResponsesCustomCallOutputItem
    | ResponsesLocalShellCallItem
    | ResponsesLocalShellOutputItem
    | ResponsesShellCallItem
    | ResponsesShellOutputItem
    | ResponsesApplyPatchCallItem
    | ResponsesApplyPatchOutputItem
    | ResponsesAdditionalToolsItem
    | ResponsesItemReference
    | ResponsesHostedItem
)


class ResponsesToolChoiceNamed(_Open):
    type: Literal["function", "custom"]
    name: Annotated[str, Field(min_length=1, description="a tool in `tools`")]


class ResponsesToolChoiceAllowed(_Open):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"] | None = None
    tools: list[Json] | None = None


class ResponsesToolChoiceHosted(_Open):
    """A client tool by type (`local_shell`, `shell`, `apply_patch`); a hosted tool's type is a 400."""

    type: Annotated[str, Field(pattern=r"^(?!(function|custom|allowed_tools)$)")]


class ResponsesReasoning(_Open):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed", "none"] | None = None
    generate_summary: Literal["auto", "concise", "detailed", "none"] | None = None


class ResponsesFormatSimple(_Open):
    type: Literal["text", "json_object"]


class ResponsesFormatJsonSchema(_Open):
    type: Literal["json_schema"]
    name: NonEmpty
    schema_: dict[str, Json] = Field(alias="schema")
    strict: bool | None = None


class ResponsesText(_Open):
    verbosity: Literal["low", "medium", "high"] | None = None
    format: ResponsesFormatSimple | ResponsesFormatJsonSchema | None = None


class ResponsesStreamOptions(_Open):
    pass


class ResponsesRequest(_Open):
    """`POST /v1/responses`. `input` is required unless `previous_response_id` is given; a named
    `tool_choice` must name a tool in `tools`."""

    model: Name
    input: str | list[ResponsesItem] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: (
        Literal["auto", "none", "required"]
        | ResponsesToolChoiceNamed
        | ResponsesToolChoiceAllowed
        | ResponsesToolChoiceHosted
        | None
    ) = None
    parallel_tool_calls: bool | None = None
    reasoning: ResponsesReasoning | None = None
    text: ResponsesText | None = None
    include: list[str] | None = Field(
        None,
        description="'reasoning.encrypted_content': sealed reasoning; "
        "'message.output_text.logprobs': the output text's log-probabilities",
    )
    store: bool | None = None
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    stream: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Temperature2 | None = None
    top_p: Probability | None = None
    truncation: Literal["auto", "disabled"] | None = None
    metadata: OpenAIMetadata | None = None
    user: str | None = None
    background: Literal[False] | None = Field(None, description="background responses are not supported")
    conversation: None = Field(None, description="not supported")
    prompt: None = Field(None, description="not supported")
    nvext: NvExt | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = Field(
        None, description="alternatives per token in `output_text.logprobs`"
    )
    safety_identifier: Any = None
    stream_options: Any = None
    service_tier: Any = None
    prompt_cache_retention: Any = None
    client_metadata: Any = None
    max_tool_calls: Any = None


class ResponsesUsage(_Open):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponsesErrorBody(_Open):
    code: str
    message: str


class ResponseObject(_Open):
    """A Response (`POST /v1/responses`, `GET /v1/responses/{id}`, and inside stream events)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    error: ResponsesErrorBody | None
    incomplete_details: Json | None
    model: str
    output: list[Json]
    usage: ResponsesUsage | None


class ResponsesStreamEvent(_Open):
    """One SSE frame's data (`event:` repeats `type`): `response.created`, `response.in_progress`,
    `response.output_item.added/done`, `response.content_part.added/done`,
    `response.output_text.delta/done`, `response.reasoning_text.delta/done`,
    `response.reasoning_summary_*`, `response.function_call_arguments.delta/done`,
    `response.custom_tool_call_input.delta/done`; it ends with `response.completed`,
    `response.incomplete` or `response.failed` (or `error` if even that cannot be built)."""

    type: str
    sequence_number: int | None = None
    response: ResponseObject | None = None


class ResponseDeleted(_Closed):
    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]


# -- models, catalogs, tool events ------------------------------------------------------------------


class OpenAIModel(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    context_window: int | None = Field(None, description="the model's window (its config.json)")


class CodexModelInfo(_Open):
    """Codex's `ModelInfo` (codex-rs protocol): context window, truncation, reasoning levels."""

    slug: str
    display_name: str
    context_window: int
    auto_compact_token_limit: int | None = None
    supported_reasoning_levels: list[Json]
    truncation_policy: Json


class OpenAIModelList(_Open):
    """OpenAI's model list; `models` is Codex's catalog (when the catalog is on)."""

    object: Literal["list"]
    data: list[OpenAIModel]
    models: list[CodexModelInfo] | None = None


class CodexCatalog(_Open):
    models: list[CodexModelInfo]


class AnthropicModel(_Open):
    type: Literal["model"]
    id: str
    display_name: str
    created_at: str
    max_input_tokens: int | None = None
    max_tokens: int | None = None


class AnthropicModelList(_Open):
    data: list[AnthropicModel]
    has_more: bool
    first_id: str | None
    last_id: str | None


class ToolEventContext(_Open):
    session_id: Annotated[str, Field(pattern=_ID_PATTERN)]
    parent_session_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None
    trajectory_id: Annotated[str, Field(pattern=_ID_PATTERN)] | None = None


class ToolEventTool(_Open):
    tool_call_id: Annotated[str, Field(pattern=_ID_PATTERN)]
    tool_name: Any = None
    tool_class: str | None = None
    status: str | None = Field(None, description="tool_end: succeeded/failed/cancelled; tool_error: failed")
    started_at_unix_ms: Annotated[float, Field(ge=0)] | None = None
    ended_at_unix_ms: Annotated[float, Field(ge=0)] | None = None
    duration_ms: Annotated[float, Field(ge=0)] | None = None
    error_type: str | None = None
    output_bytes: Annotated[int, Field(ge=0)] | None = None
    output_tokens: Annotated[int, Field(ge=0)] | None = None


class ToolEvent(_Open):
    """A harness tool event (docs/telemetry.md), joined to the request that dispatched the call."""

    schema_: str | None = Field(None, alias="schema")
    event_type: Literal["tool_start", "tool_end", "tool_error"]
    event_time_unix_ms: Annotated[float, Field(ge=0)] | None = None
    event_source: Literal["harness"] | None = None
    agent_context: ToolEventContext
    tool: ToolEventTool


class ToolEventsAccepted(_Closed):
    accepted: int
    joined: int


class ServiceIdentity(_Open):
    name: str
    version: str
    models: list[str]


class Health(_Open):
    status: Literal["ok"]


class Readiness(_Open):
    """The router's state (workers, their readiness) and the signing key's fingerprint."""

    ready: bool
    draining: bool
    signing_key: str


# -- the components of /openapi.json ---------------------------------------------------------------

COMPONENT_MODELS: tuple[type[BaseModel], ...] = (
    AnthropicMessagesRequest, AnthropicCountTokensRequest, AnthropicMessage, AnthropicCountTokensResponse,
    AnthropicStreamEvent, AnthropicError, ChatCompletionRequest, ChatCompletion, ChatCompletionChunk,
    OpenAIError, ResponsesRequest, ResponseObject, ResponsesStreamEvent, ResponseDeleted, OpenAIModel,
    OpenAIModelList, CodexCatalog, AnthropicModel, AnthropicModelList, ToolEvent, ToolEventsAccepted,
    ServiceIdentity, Health, Readiness,
)  # fmt: skip
REF = "#/components/schemas/{model}"


def component_schemas() -> dict[str, Any]:
    """Every model above as an OpenAPI 3.1 component (JSON Schema 2020-12), `$ref`s into
    `#/components/schemas`. Requests in validation mode (what clients send)."""
    _, top = models_json_schema([(m, "validation") for m in COMPONENT_MODELS], ref_template=REF)
    defs: dict[str, Any] = top.get("$defs", {})
    return defs


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}
