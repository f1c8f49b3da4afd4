"""Anthropic Messages API codec: `/v1/messages` bodies in, SSE frames / message JSON out.

Decoding (`decode_messages`, `decode_count_tokens`) maps the body onto Conversation + options:
- `system` (string or text blocks) becomes `Conversation.system`; `role: "system"` entries inside
  `messages` (Claude Code's mid-conversation system beta) stay where they are as system messages.
- Consecutive user (or assistant) messages are one turn, as on the real API.
- `tool_result` blocks become `role: "tool"` messages in place (the canonical form every API shares),
  each naming its call; a result for a call that never appeared is a 400, like the real API.
- `thinking` blocks become Reasoning(text, signature) in order; `redacted_thinking` cannot be read and
  is dropped. `tool_use.input` becomes arguments text: the model's exact text when the call memory
  still has it, else `json.dumps` with the usual separators (what models write).
- Tool ids map back through `ids.canonical_call_id` (we hand out `toolu_…` for `call_…`).
- `cache_control` is accepted anywhere and ignored (our prefix cache needs no breakpoints);
  server tools, server-tool blocks and unknown top-level fields are accepted and listed in `ignored`.

Encoding: `AnthropicStreamEncoder` (sans-IO, fed OutputEvents, returns SSE bytes) and
`build_message` (non-streaming JSON). Decisions:
- Each reasoning segment is its own `thinking` block, closed by a `signature_delta` carrying an HMAC
  of its text (`signing.Signer`), so N segments stay N blocks and we recognise them when they return.
  With `thinking.display: "omitted"` (`omit_thinking=True`) the block carries no text and the
  signature seals it instead, as the real API does; the decoder (given the signer) restores it.
  Thinking blocks are emitted whenever the model reasons, even if the request did not ask for
  thinking: dropping them would lose them from the next prompt (ask the template not to think).
- A `tool_use` block is held until its call completes, then sent whole (start, one
  `input_json_delta` with the arguments, stop): the `content_block_stop` is the dispatch point and
  Claude Code never sees a call that will not be dispatched. With `stream_tool_input=True` the
  fragments stream live instead; a call that then fails ends the stream with an `error` event, so
  the client retries rather than running half a call.
- A call that fails (ToolCallError, or cut off by max_tokens) is never a `tool_use`: its raw text
  becomes a text block, so nothing the model wrote is lost.
- With `dispatch=False` (streaming tool dispatch turned off) everything from the first completed
  call on is held until the end of the turn: the same stream, only later.
- `stop_reason` is `tool_use` as soon as one call was dispatched (the client may already be running
  it), else `max_tokens` / `stop_sequence` / `end_turn`.
"""

from agentserve.api.anthropic.decode import count_tokens_body, decode_count_tokens, decode_messages
from agentserve.api.anthropic.encode import AnthropicStreamEncoder, build_message, error_event, stop_reason

__all__ = [
    "AnthropicStreamEncoder",
    "build_message",
    "count_tokens_body",
    "decode_count_tokens",
    "decode_messages",
    "error_event",
    "stop_reason",
]
