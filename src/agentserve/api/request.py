"""The result of decoding any API's request body: one shape the rest of the frontend consumes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentserve.api.identity import AgentIdentity, BodyIdentity, resolve_identity
from agentserve.api.nvext import NvExt
from agentserve.api.options import GenerationOptions
from agentserve.conversation import Conversation

if TYPE_CHECKING:  # the anthropic package imports this module
    from agentserve.api.anthropic.context import AppliedEdit, ContextManagement

ApiName = Literal["anthropic", "chat", "responses"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodedRequest:
    api: ApiName
    conversation: Conversation
    options: GenerationOptions
    identity: BodyIdentity = field(default_factory=BodyIdentity)
    nvext: NvExt = field(default_factory=NvExt)
    # Fields accepted but not acted on (JSON paths), for the server to log; never an error.
    ignored: tuple[str, ...] = ()
    # Calls whose exact arguments / turns came back from the call memory (for traces and tests).
    restored: int = 0
    # Chat custom (freeform) tools: their calls are encoded as `type: custom` with the raw input.
    custom_tools: frozenset[str] = frozenset()

    def agent_identity(self, headers: Mapping[str, str]) -> AgentIdentity:
        """Session, parent and trajectory ids from the headers, `nvext.agent_context` and the body."""
        return resolve_identity(headers, self.nvext.agent_context, self.identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class AnthropicRequest(DecodedRequest):
    user_id: str | None = None
    context_management: ContextManagement | None = None  # edits applied before rendering
    # What the frontend's edits cleared (`context_management.applied_edits` in the response).
    applied_edits: tuple[AppliedEdit, ...] = ()


ToolKind = Literal["function", "custom", "local_shell", "shell", "apply_patch"]


@dataclass(frozen=True, slots=True)
class ResponsesTool:
    """How a tool the model may call must be echoed back in Responses output."""

    kind: ToolKind = "function"
    namespace: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsesRequest(DecodedRequest):
    store: bool = True
    previous_response_id: str | None = None
    include: tuple[str, ...] = ()
    prompt_cache_key: str | None = None
    instructions: str | None = None
    tool_kinds: Mapping[str, ResponsesTool] = field(default_factory=dict)
    # Request fields the Response object repeats back (tools, tool_choice, reasoning, text, ...).
    echo: Mapping[str, Any] = field(default_factory=dict)
    truncation: Literal["auto", "disabled"] = "disabled"  # auto: drop the oldest items to fit

    @property
    def wants_encrypted_reasoning(self) -> bool:
        return "reasoning.encrypted_content" in self.include
