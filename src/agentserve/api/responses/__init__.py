"""OpenAI Responses API codec (Codex): `/v1/responses` bodies in, SSE events / Response JSON out.

Decoding (`decode_responses`):
- `instructions`, then the leading `system`/`developer` input messages, form `Conversation.system`;
  later ones stay in place as system messages.
- Consecutive assistant-side items (reasoning, assistant message, function_call, custom_tool_call)
  are one assistant turn, in their order: reasoning_0 → call_0 → reasoning_1 → call_1 round-trips.
- A reasoning item's text is, in order of trust: our own sealed `encrypted_content` (exact text,
  even if the client dropped `content`), its `reasoning_text` content, else nothing (a summary of
  someone else's reasoning is not the model's reasoning).
- `function_call_output` / `custom_tool_call_output` become `role: "tool"` messages naming their call
  (string or input_text/input_image array output); an output for an unknown call is a 400.
- `custom` (freeform) tools are offered to the model as functions taking `{"input": string}`;
  `namespace` tools are flattened (the namespace is echoed on output items); hosted tools
  (web_search, local_shell, mcp…) and `item_reference`-free server items are accepted and ignored.
- `previous_response_id` prepends the stored history (`ResponseStore`); unknown, or no store, is a
  400 `previous_response_not_found`. `store: false` needs nothing from us: clients send everything.

Encoding (`ResponsesStreamEncoder`, `build_response`): every event Codex reads, each with
`sequence_number`; items are `rs_…` reasoning (raw text as `reasoning_text` content, mirrored into
summary parts when the request asked for a summary, sealed into `encrypted_content` when `include`
asks for it), `msg_…` messages, `fc_…` function calls with our `call_…` ids (`ctc_…` custom calls).
A function call is sent whole at its ToolCallEnd (added, arguments delta/done, `output_item.done`:
the dispatch point); `stream_tool_arguments=True` streams the arguments live instead, and
`dispatch=False` holds everything from the first completed call until the end of the turn. A failed call
becomes a message with its raw text, or (live) `response.failed`. Length with no call dispatched is
`response.incomplete` (max_output_tokens); errors are `response.failed` with a code Codex knows
(`context_length_exceeded`, `rate_limit_exceeded`, else `server_error`).
"""

from agentserve.api.custom_format import CUSTOM_INPUT
from agentserve.api.responses.common import ResponseStore, custom_input, custom_tool_parameters
from agentserve.api.responses.decode import decode_responses
from agentserve.api.responses.encode import (
    ResponsesStreamEncoder,
    build_response,
    failed_error_json,
    usage_json,
)

__all__ = [
    "CUSTOM_INPUT",
    "ResponseStore",
    "ResponsesStreamEncoder",
    "build_response",
    "custom_input",
    "custom_tool_parameters",
    "decode_responses",
    "failed_error_json",
    "usage_json",
]
