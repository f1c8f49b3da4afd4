"""The two vocabularies everything in agentserve speaks.

*Conversation* (input side): what a request means, whichever API it came through. Every API codec
decodes into it and no API type leaks past the codec. Order of parts inside a message is meaning:
reasoning that explains a tool call sits right before it.

*OutputEvent* (output side): what a model's raw text turns into, produced by exactly one owner, the
family's streaming output parser. API encoders only translate these events; nobody re-parses text.

These are plain frozen dataclasses with slots: they are created per streamed chunk (hot path); the
per-token deltas take `fast_init`'s cheaper constructor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from agentserve.hotpath import fast_init

# --------------------------------------------------------------------------------------------------
# Conversation (input side)


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """One reasoning segment. `signature` round-trips opaque provider signatures (Anthropic)."""

    text: str
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made. `arguments` is the JSON object text exactly as dispatched."""

    id: str
    name: str
    arguments: str = "{}"

    def arguments_dict(self) -> dict[str, Any]:
        """The arguments as a dict (templates that iterate `.items()` need one); `{}` if not an object."""
        try:
            value = json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class Image:
    """An image by base64 data or URL."""

    media_type: str = ""
    data: str = ""
    url: str = ""


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    content: tuple[Text | Image, ...] = ()
    is_error: bool = False
    name: str = ""  # the called tool's name when the API carries it (helps templates that need it)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, Text))


Part: TypeAlias = Text | Reasoning | ToolCall | ToolResult | Image
Role: TypeAlias = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    parts: tuple[Part, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Text))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCall))


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # JSON schema of the arguments object
    strict: bool = False  # the arguments must match `parameters` (enforced by the constraint)
    # What the constraint enforces instead of `parameters` (a Responses custom tool's regex format),
    # always; `parameters` stays what the prompt shows.
    enforce: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    system: tuple[Text, ...] = ()
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSpec, ...] = ()


# --------------------------------------------------------------------------------------------------
# OutputEvents (output side)


@fast_init
@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    """The current reasoning segment closed; the next ReasoningDelta starts a new segment.

    Emitted once per non-empty segment, so N thinking blocks in the output stay N blocks in every API.
    """


@dataclass(frozen=True, slots=True)
class TokenProb:
    """One answer token's log-probability as the OpenAI APIs show it: the token's text (its bytes
    decoded, lossy where the token splits a character), its exact bytes, and the most likely
    alternatives (each a `TokenProb` without alternatives of its own)."""

    token: str
    bytes: tuple[int, ...]
    logprob: float
    top: tuple[TokenProb, ...] = ()


@fast_init
@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    # The log-probabilities of the tokens whose text this delta completes (None: not asked for).
    logprobs: tuple[TokenProb, ...] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The name of call `index` is known; arguments follow as ToolCallArgsDelta fragments."""

    index: int
    id: str
    name: str


@fast_init
@dataclass(frozen=True, slots=True)
class ToolCallArgsDelta:
    """A fragment of the arguments JSON text; the fragments of one call concatenate to its arguments."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """The dispatch point: call `index` is closed and `arguments` is a valid JSON object text."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """Call `index` started but will never be dispatched: truncated output or malformed arguments.

    `raw` is the model's text for the call so nothing is lost.
    """

    index: int
    reason: Literal["truncated", "malformed"]
    raw: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "abort", "error"]


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    usage: Usage = field(default_factory=Usage)


OutputEvent: TypeAlias = (
    ReasoningDelta
    | ReasoningEnd
    | TextDelta
    | ToolCallStart
    | ToolCallArgsDelta
    | ToolCallEnd
    | ToolCallError
    | Finish
)
