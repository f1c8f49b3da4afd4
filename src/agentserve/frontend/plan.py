"""Pure decisions between a decoded request and the engine: budget, sampling, hints, routing.

Nothing here does I/O; `generate.py` is the edge that runs what these functions decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from agentserve.api.errors import ContextLengthError
from agentserve.api.options import GenerationOptions
from agentserve.api.request import DecodedRequest
from agentserve.conversation import Conversation, Message, ToolResult
from agentserve.router.placement import RouteRequest
from agentserve.worker.engine import SAMPLING_FIELDS, Hints, SamplingParams

_HINT_CHARS = 4000  # the sim's output policies read a message's start; never copy a whole file


def output_budget(
    requested: int | None, prompt_tokens: int, context_window: int, max_output: int | None = None
) -> int:
    """Tokens the model may generate: what was asked, clamped to the room the window leaves and to
    the model's own output limit (`max_output`, what the catalogs advertise; None: none stated).

    A prompt that leaves no room is the API's context-length error (Claude Code compacts on its
    "prompt is too long" message, Codex on `context_length_exceeded`). A `max_tokens` larger than
    the room is clamped rather than refused: harnesses send one large value (Claude Code 32000)
    whatever the prompt's size.
    """
    room = context_window - prompt_tokens
    if room < 1:
        raise ContextLengthError(prompt_tokens, context_window)
    if max_output is not None:
        room = min(room, max_output)
    if requested is None:
        return room
    return max(1, min(requested, room))


@dataclass(frozen=True, slots=True)
class EngineStops:
    """The family's end-of-turn tokens as the engine takes them: ids where the tokenizer has the token
    as one id (how trtllm-serve passes them), strings otherwise."""

    token_ids: tuple[int, ...] = ()
    strings: tuple[str, ...] = ()


def engine_stops(stop_tokens: Sequence[str], token_id: Callable[[str], int | None]) -> EngineStops:
    """Resolve a family's `stop_tokens` once per deployment (not per request)."""
    ids: list[int] = []
    strings: list[str] = []
    for token in dict.fromkeys(stop_tokens):
        found = token_id(token)
        if found is None:
            strings.append(token)
        else:
            ids.append(found)
    return EngineStops(tuple(ids), tuple(strings))


# What the API options carry under the engine's own names (the samplers, logprobs, logit_bias) goes
# to the engine as it is; `max_tokens` and `stop` are decided here (context window, stop matcher).
OPTION_SAMPLERS: tuple[str, ...] = tuple(
    sorted(SAMPLING_FIELDS & {f.name for f in fields(GenerationOptions)} - {"max_tokens", "stop"})
)


def sampling_params(
    options: GenerationOptions, max_tokens: int, stops: EngineStops = EngineStops()
) -> SamplingParams:
    """Engine sampling settings. User stop strings are matched by the frontend (`stops.StopMatcher`),
    so it knows which one ended the turn; the engine sees the token budget, the samplers and the
    family's end-of-turn tokens, which it keeps in the output (`include_stop`): the family's parser
    reads the terminator (`<|call|>` dispatches a gpt-oss call) and the session's token ids stay
    those the next turn's prompt renders."""
    return SamplingParams(
        max_tokens=max_tokens,
        **{name: getattr(options, name) for name in OPTION_SAMPLERS},
        stop=stops.strings,
        stop_token_ids=stops.token_ids,
        include_stop=bool(stops.token_ids or stops.strings),
    )


def _message_text(message: Message) -> str:
    parts = [p.text for p in message.parts if isinstance(p, ToolResult)]
    return "".join(parts) if parts else message.text


def generation_hints(conversation: Conversation) -> Hints:
    """Which turn this is and what the last messages said (the sim engine's policies read these)."""
    messages = conversation.messages
    turn = sum(1 for m in messages if m.role == "assistant") + 1
    last_user = next((m.text for m in reversed(messages) if m.role == "user"), "")
    last = _message_text(messages[-1]) if messages else ""
    return Hints(turn=turn, last_user_message=last_user[:_HINT_CHARS], last_message=last[:_HINT_CHARS])


def route_request(
    request: DecodedRequest, block_hashes: tuple[int, ...], prompt_tokens: int, session_id: str | None
) -> RouteRequest:
    hints = request.nvext.agent_hints
    return RouteRequest(
        block_hashes=block_hashes,
        prompt_tokens=prompt_tokens,
        session_id=session_id,
        priority=hints.priority or 0,
        osl=hints.osl,
    )
