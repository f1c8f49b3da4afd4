"""OpenAI Chat Completions codec: `/v1/chat/completions` bodies in, chunks / completion JSON out.

Decoding (`decode_chat`):
- Leading `system`/`developer` messages form `Conversation.system`; later ones stay in place as
  system messages (OpenClaw and pi put context there).
- Assistant `reasoning_content` or `reasoning` (either; vLLM renamed one to the other) becomes a
  Reasoning part before the text and calls. `tool` messages become `role: "tool"` messages naming their
  call; a result for an unknown call id is a 400, as on the real API.
- With a `CallMemory`, an assistant message that still describes a turn we produced (same calls,
  equal arguments, same text, reasoning dropped or unchanged) is replaced by that turn exactly as the
  model wrote it: reasoning segments in their places, argument text byte-exact, our call ids (tool
  messages follow, even when the client rewrote the ids).
- Legacy `functions` / `function_call` / `role: "function"` are mapped onto tools and calls.
- `n` other than 1 is a 400: one choice per request.

Encoding (`ChatStreamEncoder`, `build_chat_completion`):
- First chunk carries the role; reasoning deltas carry both `reasoning_content` and `reasoning`;
  reasoning segments after the first are preceded by a blank line in this flat field.
- A tool call is held until complete and sent as one `tool_calls` delta (index, id, type, name and
  the whole arguments); `stream_tool_arguments=True` streams id/type/name first and then argument
  fragments (index on every fragment). Indexes count the calls actually sent.
- At each ToolCallEnd with `dispatch=True`, a side-channel `event: tool_call_dispatch` frame carries
  `{"choice_index", "tool_call"}` (Dynamo's fields). It is also a valid chunk with `choices: []`,
  because the official SDKs hand every data frame to the caller as a chunk whatever its event name;
  consumers see an empty chunk (like the usage chunk) and move on. `dispatch=False` drops only this
  frame (`--no-enable-streaming-tool-dispatch`); the chunks are the same.
- A failed call is never a tool call: held calls surface their raw text as content; a live call that
  fails ends the stream with an error frame.
- `finish_reason` is `tool_calls` once a call was sent, else `length` / `stop`; with
  `include_usage` a final `choices: []` chunk carries usage (`cached_tokens`, `reasoning_tokens`);
  the stream ends with `data: [DONE]`.
"""

from agentserve.api.chat.decode import decode_chat
from agentserve.api.chat.encode import (
    REASONING_SEPARATOR,
    ChatStreamEncoder,
    build_chat_completion,
    finish_reason,
    usage_json,
)

__all__ = [
    "REASONING_SEPARATOR",
    "ChatStreamEncoder",
    "build_chat_completion",
    "decode_chat",
    "finish_reason",
    "usage_json",
]
