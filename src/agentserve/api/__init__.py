"""API codecs: wire JSON ⇄ the canonical Conversation / OutputEvents, for the three agent APIs.

Pure and sans-IO: decoders take parsed JSON (and headers, for identity) and return a
`DecodedRequest` or raise an `ApiError`; encoders are fed OutputEvents and return SSE bytes, or
build the non-streaming JSON body. The HTTP frontend owns sockets, timing and state lifetimes (the
call memory, the response store, the signing key).

- `anthropic`: `/v1/messages`, `/v1/messages/count_tokens` (Claude Code)
- `chat`: `/v1/chat/completions` (pi, OpenClaw, most harnesses)
- `responses`: `/v1/responses` (Codex)
- `catalog`: `/v1/models` in Anthropic and OpenAI shape, and Codex's model catalog
- `identity`, `nvext`: session / parent / trajectory ids and agent hints
- `errors`: one error hierarchy, rendered in each API's shape
"""

from agentserve.api.anthropic import (
    AnthropicStreamEncoder,
    build_message,
    count_tokens_body,
    decode_count_tokens,
    decode_messages,
)
from agentserve.api.catalog import (
    ModelFacts,
    anthropic_model,
    anthropic_models,
    codex_catalog,
    find_model,
    openai_model,
    openai_models,
)
from agentserve.api.chat import ChatStreamEncoder, build_chat_completion, decode_chat
from agentserve.api.errors import ApiError
from agentserve.api.identity import AgentIdentity, resolve_identity
from agentserve.api.memory import CallMemory
from agentserve.api.nvext import AgentHints, NvExt
from agentserve.api.options import GenerationOptions
from agentserve.api.request import AnthropicRequest, DecodedRequest, ResponsesRequest
from agentserve.api.responses import ResponsesStreamEncoder, ResponseStore, build_response, decode_responses
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator

__all__ = [
    "AgentHints",
    "AgentIdentity",
    "AnthropicRequest",
    "AnthropicStreamEncoder",
    "ApiError",
    "CallMemory",
    "ChatStreamEncoder",
    "DecodedRequest",
    "GenerationOptions",
    "ModelFacts",
    "NvExt",
    "ResponseStore",
    "ResponsesRequest",
    "ResponsesStreamEncoder",
    "Signer",
    "TurnAccumulator",
    "anthropic_model",
    "anthropic_models",
    "build_chat_completion",
    "build_message",
    "build_response",
    "codex_catalog",
    "count_tokens_body",
    "decode_chat",
    "decode_count_tokens",
    "decode_messages",
    "decode_responses",
    "find_model",
    "openai_model",
    "openai_models",
    "resolve_identity",
]
